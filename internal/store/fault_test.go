package store_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// errInjected reads as a network timeout, as a slow or partitioned Redis's
// replies do.
var errInjected error = &net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout (injected)" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// faultHook fails the commands match selects, while on is set, with
// errInjected: they are not sent to Redis (the server is real; only the
// fault is made up). Within a pipeline the others run as usual. hits counts
// the commands it failed.
type faultHook struct {
	match func(cmd redis.Cmder) bool
	on    atomic.Bool
	hits  atomic.Int64
}

func (h *faultHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() && h.match(cmd) {
			h.hits.Add(1)
			cmd.SetErr(errInjected)
			return errInjected
		}
		return next(ctx, cmd)
	}
}

func (h *faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !h.on.Load() {
			return next(ctx, cmds)
		}
		var pass []redis.Cmder
		for _, c := range cmds {
			if h.match(c) {
				h.hits.Add(1)
				c.SetErr(errInjected)
			} else {
				pass = append(pass, c)
			}
		}
		var err error
		if len(pass) > 0 {
			err = next(ctx, pass)
		}
		if len(pass) < len(cmds) && err == nil {
			err = errInjected
		}
		return err
	}
}

// isCmd reports whether cmd is name (case-insensitive) and one of its
// arguments contains sub.
func isCmd(cmd redis.Cmder, name, sub string) bool {
	if !strings.EqualFold(cmd.Name(), name) {
		return false
	}
	for _, a := range cmd.Args() {
		if p, ok := a.(*string); ok { // a script's keys go by pointer
			a = *p
		}
		if s, ok := a.(string); ok && strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
