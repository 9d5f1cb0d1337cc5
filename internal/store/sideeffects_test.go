package store_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// dlqLen is how many entries the test's DLQ stream holds.
func (b *bundle) dlqLen(t *testing.T) int64 {
	t.Helper()
	n, err := b.s.Client().XLen(context.Background(), b.s.Keys().DLQ()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFencedWriteHasNoSideEffects: a write refused because its owner is
// stale (another node adopted the job) neither gives the job's tenant slot
// back — it is the new owner's now — nor appends to the DLQ.
func TestFencedWriteHasNoSideEffects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tenant := b.s.Keys().TenantActive("acme")
	b.activate(t, "jf", "a", true)
	if r := b.do(t, &store.Op{Kind: store.OpAdmit, JobID: "jf", TenantKey: tenant, Limit: 10}); !r.Admitted {
		t.Fatal("not admitted")
	}
	// a's lock expires and b adopts the job: a|1 is stale.
	if err := b.s.Client().Del(ctx, b.s.Keys().Lock("jf")).Err(); err != nil {
		t.Fatal(err)
	}
	if r := b.activate(t, "jf", "b", false); r.Status != store.ActivateAdopted || r.Fence != 2 {
		t.Fatalf("adoption: %+v", r)
	}
	// a, stalled, times the job out: the write is fenced.
	r := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "jf", Node: "a", LockValue: "a|1",
		TenantRelease: tenant,
		DLQ:           &store.DLQEntry{JobID: "jf", Reason: jobstate.ReasonDispatchTimeout, Message: "stale owner"},
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StatePending), Op: "stale-op",
			Path: []store.Hop{{To: jobstate.StateTimeout, Reason: jobstate.ReasonDispatchTimeout}}}})
	if r.Step != store.StepFenced {
		t.Fatalf("stale owner's write: %+v, want FENCED", r)
	}
	if _, err := b.s.Client().ZScore(ctx, tenant, "jf").Result(); err != nil {
		t.Fatalf("the new owner's tenant slot was given back by a fenced write (%v)", err)
	}
	if n := b.dlqLen(t); n != 0 {
		t.Fatalf("a fenced write appended %d DLQ entries", n)
	}
	// The owner's own write has both effects.
	r = b.do(t, &store.Op{Kind: store.OpTransition, JobID: "jf", Node: "b", LockValue: "b|2",
		TenantRelease: tenant,
		DLQ:           &store.DLQEntry{JobID: "jf", Reason: jobstate.ReasonDispatchTimeout, Message: "owner"},
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StatePending), Op: "owner-op",
			Path: []store.Hop{{To: jobstate.StateTimeout, Reason: jobstate.ReasonDispatchTimeout}}}})
	if !r.OK() {
		t.Fatalf("owner's write: %+v", r)
	}
	if n, _ := b.s.Client().ZCard(ctx, tenant).Result(); n != 0 {
		t.Fatalf("the owner's terminal write kept its tenant slot (%d held)", n)
	}
	if n := b.dlqLen(t); n != 1 {
		t.Fatalf("DLQ holds %d entries after the owner's write, want 1", n)
	}
}

// TestDuplicateCreateWritesNoSecondDLQEntry: a submit denied at creation
// (a plan ending DENIED, with its DLQ entry) that arrives twice — a
// JetStream redelivery — dead-letters the job once: the second activation
// finds the job and applies nothing, so it appends nothing either.
func TestDuplicateCreateWritesNoSecondDLQEntry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	deny := func(op string) *store.Op {
		return &store.Op{Kind: store.OpActivate, JobID: "jd", Node: "a", Create: true, Topic: "job.x", Tenant: "t",
			Request: []byte("req"),
			T:       &store.Transition{Op: op, Path: []store.Hop{{To: jobstate.StateDenied, Reason: jobstate.ReasonSafetyDenied}}},
			DLQ:     &store.DLQEntry{JobID: "jd", Topic: "job.x", Reason: jobstate.ReasonSafetyDenied, Message: "denied"}}
	}
	if r := b.do(t, deny("first")); r.Status != store.ActivateCreated || r.State != jobstate.StateDenied {
		t.Fatalf("first submit: %+v", r)
	}
	if n := b.dlqLen(t); n != 1 {
		t.Fatalf("DLQ holds %d entries after the denial, want 1", n)
	}
	if r := b.do(t, deny("second")); r.Status != store.ActivateTerminal {
		t.Fatalf("duplicate submit: %+v", r)
	}
	if n := b.dlqLen(t); n != 1 {
		t.Fatalf("DLQ holds %d entries after a duplicate submit, want 1", n)
	}
}

// TestDLQEntryReachesTheStreamOnceAfterFailures: the DLQ entry of an applied
// write reaches the stream exactly once whatever fails after the write: an
// append that fails (the op's retry finds its own write and appends again), a writer that dies before appending (the outbox flush appends),
// and a flush of an entry already appended (its mark stops it).
func TestDLQEntryReachesTheStreamOnceAfterFailures(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	hook := &faultHook{match: func(c redis.Cmder) bool { return isCmd(c, "eval", b.s.Keys().DLQ()) }}
	b.s.Client().AddHook(hook)
	fail := func(id string) *store.Op {
		b.activate(t, id, "a", true)
		return &store.Op{Kind: store.OpTransition, JobID: id, Node: "a", LockValue: "a|1",
			DLQ: &store.DLQEntry{JobID: id, Reason: jobstate.ReasonDispatchTimeout},
			T: &store.Transition{Expect: jobstate.Expect(jobstate.StatePending), Op: "op-" + id,
				Path: []store.Hop{{To: jobstate.StateFailed, Reason: jobstate.ReasonDispatchTimeout}}}}
	}
	submit := func(op *store.Op) *store.Result {
		ch := make(chan *store.Result, 1)
		op.Done = func(r *store.Result) { ch <- r }
		b.w.Submit(op)
		return <-ch
	}

	// 1. The append fails (Redis out of memory, say): the job's write
	// applied and says so — it is not tried again for its DLQ entry, which
	// waits in its outbox; the flush appends it, once.
	op := fail("r1")
	hook.on.Store(true)
	if r := submit(op); !r.OK() {
		t.Fatalf("op with a failed DLQ append: %+v, want it applied", r)
	}
	hook.on.Store(false)
	if n := b.dlqLen(t); n != 0 {
		t.Fatalf("stream holds %d entries after a failed append", n)
	}
	for i := 0; i < 2; i++ {
		n, err := b.s.FlushDLQOutbox(ctx, 0, 100)
		if err != nil || n != 1-i {
			t.Fatalf("flush %d moved %d (%v), want %d", i, n, err, 1-i)
		}
	}
	if n := b.dlqLen(t); n != 1 {
		t.Fatalf("stream holds %d entries after the flush, want 1", n)
	}

	// 2. A retry of a write that applied (its reply was lost) appends
	// nothing more: it is FENCED, names its own earlier write, and the
	// entry is in the stream once.
	if r := submit(op); r.Err != nil || r.Step != store.StepFenced || r.Before != "" || r.LastOp != "op-r1" {
		t.Fatalf("retry: %+v, want FENCED naming its own earlier write", r)
	}
	if n := b.dlqLen(t); n != 1 {
		t.Fatalf("stream holds %d entries after the retry, want 1", n)
	}
	hook.on.Store(true)
	if r := submit(fail("r2")); !r.OK() {
		t.Fatalf("r2: %+v", r)
	}
	hook.on.Store(false)
	if n, err := b.s.FlushDLQOutbox(ctx, 0, 100); err != nil || n != 1 {
		t.Fatalf("flush of r2 moved %d (%v), want 1", n, err)
	}
	if n := b.dlqLen(t); n != 2 {
		t.Fatalf("stream holds %d entries, want 2", n)
	}

	// 3. An entry appended but left in its outbox (the clean-up failed):
	// the flush takes it out without appending it again.
	clear := &faultHook{match: func(c redis.Cmder) bool { return isCmd(c, "zrem", "dlqout") }}
	b.s.Client().AddHook(clear)
	clear.on.Store(true)
	if r := submit(fail("r3")); !r.OK() {
		t.Fatalf("write: %+v", r)
	}
	clear.on.Store(false)
	if clear.hits.Load() != 1 {
		t.Fatalf("outbox clean-up failed %d times, want 1", clear.hits.Load())
	}
	if n, err := b.s.FlushDLQOutbox(ctx, 0, 100); err != nil || n != 1 {
		t.Fatalf("flush moved %d (%v), want 1", n, err)
	}
	if n := b.dlqLen(t); n != 3 {
		t.Fatalf("stream holds %d entries, want 3 (one per failed job)", n)
	}
	entries, err := b.s.ListDLQ(ctx, 10)
	if err != nil || len(entries) != 3 || entries[0].JobID != "r3" || entries[2].JobID != "r1" {
		t.Fatalf("entries %+v (%v)", entries, err)
	}
}

// TestRetriedTerminalWriteGivesItsTenantSlotBack: a terminal write whose
// slot release failed reports the error; its retry — FENCED, since the
// first try released the lock — sees its own write in the record and gives
// the slot back.
func TestRetriedTerminalWriteGivesItsTenantSlotBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tenant := b.s.Keys().TenantActive("acme")
	b.activate(t, "jt", "a", true)
	if r := b.do(t, &store.Op{Kind: store.OpAdmit, JobID: "jt", TenantKey: tenant, Limit: 10}); !r.Admitted {
		t.Fatal("not admitted")
	}
	hook := &faultHook{match: func(c redis.Cmder) bool { return isCmd(c, "zrem", tenant) }}
	b.s.Client().AddHook(hook)
	op := &store.Op{Kind: store.OpTransition, JobID: "jt", Node: "a", LockValue: "a|1", TenantRelease: tenant,
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StatePending), Op: "end",
			Path: []store.Hop{{To: jobstate.StateFailed, Reason: jobstate.ReasonDispatchTimeout}}}}
	ch := make(chan *store.Result, 1)
	op.Done = func(r *store.Result) { ch <- r }
	hook.on.Store(true)
	b.w.Submit(op)
	if r := <-ch; r.Err == nil {
		t.Fatalf("write whose slot release failed: %+v, want its error", r)
	}
	hook.on.Store(false)
	b.w.Submit(op)
	if r := <-ch; r.Err != nil || r.Step != store.StepFenced || r.LastOp != "end" {
		t.Fatalf("retry: %+v", r)
	}
	if n, _ := b.s.Client().ZCard(ctx, tenant).Result(); n != 0 {
		t.Fatalf("tenant slot still held after the retry")
	}
}
