package recovery

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// takeoverHook lets another owner take the lock key right after the
// poller's n-th command on it returns: the poller's lease lapsed there (it
// stalled: a GC pause, a slow network) and another replica took the lock.
// It runs on the poller's client; the takeover goes through other.
type takeoverHook struct {
	key   string
	other *redis.Client
	mu    sync.Mutex
	n     int // 0: disarmed
	seen  int
	fired bool
}

func (h *takeoverHook) arm(n int) {
	h.mu.Lock()
	h.n, h.seen, h.fired = n, 0, false
	h.mu.Unlock()
}

func (h *takeoverHook) disarm() {
	h.mu.Lock()
	h.n = 0
	h.mu.Unlock()
}

func (h *takeoverHook) hasFired() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fired
}

func (h *takeoverHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *takeoverHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *takeoverHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		touches := false
		for _, a := range cmd.Args() {
			if p, ok := a.(*string); ok { // a script's keys go by pointer
				a = *p
			}
			if s, ok := a.(string); ok && s == h.key {
				touches = true
			}
		}
		if !touches {
			return err
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.seen++; h.n > 0 && h.seen == h.n && !h.fired {
			h.fired = true
			if terr := h.other.Set(ctx, h.key, "b", time.Minute).Err(); terr != nil {
				panic(terr)
			}
		}
		return err
	}
}

// TestLeaderLockIsOwnerChecked: whichever of the poller's lock commands the
// takeover follows, a poller whose lock another owner took meanwhile
// neither extends that owner's lock nor deletes it — on a tick, or when it
// stops and gives its lock back.
func TestLeaderLockIsOwnerChecked(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	if env.Redis == nil {
		t.Skip("needs a single Redis")
	}
	ctx := context.Background()
	dial := func() *redis.Client {
		opt, err := redis.ParseURL(env.RedisURL)
		if err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(opt)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	other, client := dial(), dial()
	st := store.New(client, store.Config{Prefix: env.KeyPrefix()})
	if err := st.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	key := env.KeyPrefix() + "lock:due-poller"
	hook := &takeoverHook{key: key, other: other}
	client.AddHook(hook)

	// check: after a takeover, the lock is b's, with b's TTL (a minute);
	// an extension by a would have cut it to a's (3 poll intervals).
	check := func(what string, n int) {
		t.Helper()
		v, err := other.Get(ctx, key).Result()
		if err != nil || v != "b" {
			t.Fatalf("%s, takeover after lock command %d: lock = %q (%v), want b's lock kept", what, n, v, err)
		}
		if ttl := other.PTTL(ctx, key).Val(); ttl < 50*time.Second {
			t.Fatalf("%s, takeover after lock command %d: b's lock TTL cut to %v: extended by a", what, n, ttl)
		}
	}
	fired := 0
	for n := 1; n <= 4; n++ {
		// a holds the lock and ticks; b takes it after a's n-th command.
		if err := other.Set(ctx, key, "a", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		p := &DuePoller{Store: st, NodeID: "a", Log: log, Every: time.Second}
		hook.arm(n)
		p.Tick(ctx)
		hook.disarm()
		if !hook.hasFired() {
			continue // a issued fewer commands
		}
		fired++
		check("tick", n)
		p.Tick(ctx) // a's next tick sees b's lock
		check("next tick", n)
	}
	for n := 1; n <= 4; n++ {
		// a holds the lock and stops; b takes it after a's n-th command.
		if err := other.Set(ctx, key, "a", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		p := &DuePoller{Store: st, NodeID: "a", Log: log, Every: time.Hour}
		p.Start()
		hook.arm(n)
		p.Stop()
		hook.disarm()
		if !hook.hasFired() {
			continue
		}
		fired++
		check("stop", n)
	}
	if fired < 2 {
		t.Fatalf("the takeover happened in %d runs: the test exercised nothing", fired)
	}
}
