package intake

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
)

// countHGET counts the HGET commands a Redis client sends.
type countHGET struct{ n atomic.Int64 }

func (h *countHGET) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHGET) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		if c.Name() == "hget" {
			h.n.Add(1)
		}
		return next(ctx, c)
	}
}
func (h *countHGET) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if c.Name() == "hget" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// Issue 33: the shared copy of a result whose job's actor is live here
// reads nothing. One its actor heard waits, unread, for that actor to
// settle it and is acked then (or, past ownLiveWait, is handled as before
// issue 33 by that actor); one the actor did not hear (the subscription
// dropped it) is handled at once by that actor. Only a copy of a job not
// live here reads the job's record.
func TestSharedCopyOfALiveJobReadsNothing(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	hook := &countHGET{}
	if env.RedisURL == "" {
		t.Skip("a Redis Cluster test environment: the HGET count needs a single-node client")
	}
	rdb := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(env.RedisURL, "redis://")})
	rdb.AddHook(hook)
	t.Cleanup(func() { _ = rdb.Close() })
	st := store.New(rdb, store.Config{Prefix: env.KeyPrefix()})
	rn := st.NewLockRenewer(nil)
	for _, job := range []string{"live-heard", "live-dropped", "live-silent"} {
		if err := env.Client.Set(ctx, st.Keys().Lock(job), "n1|1", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		rn.Hold(job, "n1|1", func(bool) {})
	}
	in := &Intake{Store: st, Env: &jobactor.Env{NodeID: "n1", Renewer: rn}}
	c := &confirmer{in: in}
	in.confirm = c

	type copyOf struct {
		it     *confirmItem
		msg    *fakeMsg
		routed atomic.Int32
	}
	now := time.Now()
	shared := func(job string) *copyOf {
		res := &capv1.JobResult{JobId: job, WorkerId: "w1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
		cp := &copyOf{msg: &fakeMsg{acked: new(atomic.Int64)}}
		cp.it = &confirmItem{msg: cp.msg, job: job, key: keyOf(res), status: res.Status, taken: now,
			due: now.Add(OwnConfirmFirst), route: func() { cp.routed.Add(1) }}
		return cp
	}
	heard, dropped, silent, elsewhere := shared("live-heard"), shared("live-dropped"), shared("live-silent"), shared("elsewhere-1")
	c.settled.heard(heard.it.key)
	c.settled.heard(silent.it.key)

	at := now.Add(OwnConfirmFirst)
	again, first := c.ask([]*confirmItem{heard.it, dropped.it, silent.it, elsewhere.it}, at, nil, nil)
	if n := hook.n.Load(); n != 1 {
		t.Fatalf("the first question sent %d HGETs, want 1 (the job not live here only)", n)
	}
	if dropped.routed.Load() != 1 || dropped.msg.acked.Load() != 0 {
		t.Fatalf("the copy its live actor did not hear: routed %d, acked %d; want handled at once, unacked",
			dropped.routed.Load(), dropped.msg.acked.Load())
	}
	if len(first) != 2 || first[0] != heard.it || first[1] != silent.it {
		t.Fatalf("waiting for their live actor: %d copies, want the two heard ones", len(first))
	}
	if len(again) != 1 || again[0] != elsewhere.it || elsewhere.routed.Load() != 0 || elsewhere.msg.acked.Load() != 0 {
		t.Fatalf("the copy of a job not live here (no record) was not queued to be read again")
	}
	for _, cp := range []*copyOf{heard, silent} {
		if cp.routed.Load() != 0 || cp.msg.acked.Load() != 0 {
			t.Fatalf("a heard copy was settled before its actor settled it: routed %d, acked %d",
				cp.routed.Load(), cp.msg.acked.Load())
		}
	}

	// The actor settles the result it heard: its shared copy is acked at
	// the next question, unread; the one never settled waits on.
	c.settled.add(heard.it.key)
	at = at.Add(OwnConfirmFirst)
	_, first = c.ask(first, at, nil, nil)
	if heard.msg.acked.Load() != 1 || heard.routed.Load() != 0 {
		t.Fatalf("the settled copy: acked %d, routed %d; want acked once", heard.msg.acked.Load(), heard.routed.Load())
	}
	if len(first) != 1 || first[0] != silent.it {
		t.Fatalf("the unsettled heard copy stopped waiting early")
	}

	// Past ownLiveWait the unsettled copy goes to its actor, as before
	// issue 33 — never acked unhandled.
	_, first = c.ask(first, now.Add(ownLiveWait), nil, nil)
	if len(first) != 0 || silent.routed.Load() != 1 || silent.msg.acked.Load() != 0 {
		t.Fatalf("the copy its actor never settled: routed %d, acked %d, waiting %d; want handled once, unacked",
			silent.routed.Load(), silent.msg.acked.Load(), len(first))
	}
	if n := hook.n.Load(); n != 1 {
		t.Fatalf("the live jobs' copies sent %d HGETs in all, want only the first question's 1", n)
	}
}
