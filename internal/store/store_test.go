package store_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

type bundle struct {
	s *store.Store
	w *store.Writer
}

func setup(t *testing.T) *bundle {
	t.Helper()
	env := testenv.New(t)
	s := store.New(env.Client, store.Config{Prefix: env.KeyPrefix(), LockTTL: 10 * time.Second})
	if err := s.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := s.NewWriter(2, 64, 1024)
	t.Cleanup(w.Close)
	return &bundle{s: s, w: w}
}

// do runs op through the writer and waits for its result.
func (b *bundle) do(t *testing.T, op *store.Op) *store.Result {
	t.Helper()
	ch := make(chan *store.Result, 1)
	op.Done = func(r *store.Result) { ch <- r }
	b.w.Submit(op)
	select {
	case r := <-ch:
		if r.Err != nil {
			t.Fatalf("op %v: %v", op.Kind, r.Err)
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("op timed out")
		return nil
	}
}

func (b *bundle) activate(t *testing.T, id, node string, create bool) *store.Result {
	return b.do(t, &store.Op{Kind: store.OpActivate, JobID: id, Node: node, Create: create, Topic: "job.x",
		Tenant: "t", TraceID: "tr", Request: []byte("req")})
}

func (b *bundle) step(t *testing.T, id, node string, fence int64, from, to jobstate.State) *store.Result {
	return b.do(t, &store.Op{Kind: store.OpTransition, JobID: id, Node: node, LockValue: jobstate.LockValue(node, fence),
		T: &store.Transition{Expect: jobstate.Expect(from), Path: []store.Hop{{To: to, Reason: "test"}}}})
}

func TestActivateCreatesOnceAndFencesOtherNodes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.activate(t, "j1", "a", true)
	if r.Status != store.ActivateCreated || r.State != jobstate.StatePending || r.Fence != 1 {
		t.Fatalf("first activation: %+v", r)
	}
	r = b.activate(t, "j1", "b", true)
	if r.Status != store.ActivateBusy || r.Holder != "a|1" {
		t.Fatalf("activation while a holds the lock: %+v", r)
	}
	// Same node re-activating (a restarted actor) takes a new fence.
	r = b.activate(t, "j1", "a", true)
	if r.Status != store.ActivateAdopted || r.Fence != 2 || r.Fields["req"] != "req" || r.Fields["topic"] != "job.x" {
		t.Fatalf("re-activation: %+v", r)
	}
	// The old fence is now stale: its writes are refused.
	if sr := b.step(t, "j1", "a", 1, jobstate.StatePending, jobstate.StateScheduled); sr.Step != store.StepFenced {
		t.Fatalf("stale fence write: %+v", sr)
	}
	if sr := b.step(t, "j1", "a", 2, jobstate.StatePending, jobstate.StateScheduled); sr.Step != store.StepOK {
		t.Fatalf("owner write: %+v", sr)
	}
	if r := b.activate(t, "missing", "a", false); r.Status != store.ActivateNotFound {
		t.Fatalf("activation without create of a missing job: %+v", r)
	}
}

func TestExpiredLockIsAdoptedAndTheOldOwnerIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.activate(t, "j2", "a", true)
	// The lock expires (node a died); node b adopts. Deleting the key is
	// what expiry does, without waiting on the server's clock (the embedded
	// store's TTLs advance once a second).
	if err := b.s.Client().Del(context.Background(), b.s.Keys().Lock("j2")).Err(); err != nil {
		t.Fatal(err)
	}
	r := b.activate(t, "j2", "b", false)
	if r.Status != store.ActivateAdopted || r.Fence != 2 {
		t.Fatalf("adoption: %+v", r)
	}
	if sr := b.step(t, "j2", "a", 1, jobstate.StatePending, jobstate.StateScheduled); sr.Step != store.StepFenced {
		t.Fatalf("dead owner's write: %+v", sr)
	}
	rec, err := b.s.GetJob(context.Background(), "j2")
	if err != nil || rec.State != jobstate.StatePending || rec.Node != "b" {
		t.Fatalf("record after fenced write: %+v %v", rec, err)
	}
}

func TestTransitionCompareAndSetAndTerminalRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.activate(t, "j3", "a", true)
	if sr := b.step(t, "j3", "a", 1, jobstate.StateScheduled, jobstate.StateDispatched); sr.Step != store.StepConflict ||
		sr.Before != jobstate.StatePending {
		t.Fatalf("wrong expected state: %+v", sr)
	}
	r := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "j3", Node: "a", LockValue: "a|1", T: &store.Transition{
		Expect: jobstate.Expect(jobstate.StatePending),
		Path:   []store.Hop{{To: jobstate.StateScheduled, Reason: "r1"}, {To: jobstate.StateDispatched, Reason: "r2"}},
		Due:    time.Now().Add(time.Hour).UnixMilli(), Fields: []string{"worker", "w1"}}})
	if !r.OK() {
		t.Fatalf("two steps: %+v", r)
	}
	if due, _ := b.s.DueAt(ctx, "j3"); due.IsZero() {
		t.Fatal("due entry not set with the step")
	}
	n, _ := b.s.CountIndex(ctx, jobstate.StateDispatched)
	p, _ := b.s.CountIndex(ctx, jobstate.StatePending)
	if n != 1 || p != 0 {
		t.Fatalf("indexes: dispatched %d pending %d", n, p)
	}
	if sr := b.step(t, "j3", "a", 1, jobstate.StateDispatched, jobstate.StateSucceeded); sr.Step != store.StepOK {
		t.Fatalf("terminal: %+v", sr)
	}
	rec, _ := b.s.GetJob(ctx, "j3")
	if rec.LockHolder != "" || rec.Worker != "w1" || rec.State != jobstate.StateSucceeded {
		t.Fatalf("after terminal: %+v", rec)
	}
	if due, _ := b.s.DueAt(ctx, "j3"); !due.IsZero() {
		t.Fatal("due entry survived a terminal state")
	}
	if ttl := b.s.Client().TTL(ctx, b.s.Keys().Job("j3")).Val(); ttl != -1 {
		t.Fatalf("terminal record has a TTL (%v): the retention trim deletes it", ttl)
	}
	want := []jobstate.State{jobstate.StatePending, jobstate.StateScheduled, jobstate.StateDispatched, jobstate.StateSucceeded}
	if fmt.Sprint(states(rec.History)) != fmt.Sprint(want) {
		t.Fatalf("history %v", states(rec.History))
	}
	// A terminal job is never re-activated with a lock.
	if r := b.activate(t, "j3", "b", true); r.Status != store.ActivateTerminal || r.State != jobstate.StateSucceeded {
		t.Fatalf("activation of a terminal job: %+v", r)
	}
}

func states(h []store.HistoryEntry) []jobstate.State {
	out := make([]jobstate.State, len(h))
	for i, e := range h {
		out[i] = e.To
	}
	return out
}

func TestRenewerKeepsLocksAndReportsLostOnes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.activate(t, "keep", "a", true)
	b.activate(t, "steal", "a", true)
	b.activate(t, "gone", "a", true)
	rn := b.s.NewLockRenewer(nil)
	type loss struct {
		id       string
		vanished bool
	}
	lost := make(chan loss, 3)
	for _, id := range []string{"keep", "steal", "gone"} {
		rn.Hold(id, "a|1", func(vanished bool) { lost <- loss{id, vanished} })
	}
	rdb := b.s.Client()
	rdb.PExpire(ctx, b.s.Keys().Lock("keep"), 2*time.Second)
	rdb.Set(ctx, b.s.Keys().Lock("steal"), "b|9", time.Minute) // another owner took it
	rdb.Del(ctx, b.s.Keys().Lock("gone"))                      // Redis lost it
	rn.RenewOnce(ctx)
	got := map[string]bool{}
	for i := 0; i < 2; i++ {
		l := <-lost
		got[l.id] = l.vanished
	}
	if v, ok := got["steal"]; !ok || v {
		t.Fatalf("losses %v: want steal lost to another holder (not vanished)", got)
	}
	if v, ok := got["gone"]; !ok || !v {
		t.Fatalf("losses %v: want gone reported vanished", got)
	}
	if ttl := rdb.PTTL(ctx, b.s.Keys().Lock("keep")).Val(); ttl < 5*time.Second {
		t.Fatalf("kept lock not renewed: ttl %v", ttl)
	}
	if rn.Held() != 1 {
		t.Fatalf("held %d", rn.Held())
	}
	st := rn.Stats()
	if st.Renewed != 1 || st.Refused != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// lockLoser records what HoldFor's loser is told.
type lockLoser struct {
	id   string
	told chan<- [3]string
}

func (l lockLoser) LockLost(value string, vanished bool) {
	l.told <- [3]string{l.id, value, strconv.FormatBool(vanished)}
}

// HoldFor tells a LockLoser what Hold's function is told, with the lost
// lock's value: a kept lock tells nothing.
func TestRenewerTellsHoldForLosersTheirLockValue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.activate(t, "keep", "a", true)
	b.activate(t, "steal", "a", true)
	b.activate(t, "gone", "a", true)
	rn := b.s.NewLockRenewer(nil)
	told := make(chan [3]string, 3)
	for _, id := range []string{"keep", "steal", "gone"} {
		rn.HoldFor(id, "a|1", lockLoser{id, told})
	}
	rdb := b.s.Client()
	rdb.Set(ctx, b.s.Keys().Lock("steal"), "b|9", time.Minute)
	rdb.Del(ctx, b.s.Keys().Lock("gone"))
	rn.RenewOnce(ctx)
	close(told)
	got := map[string][3]string{}
	for l := range told {
		got[l[0]] = l
	}
	want := map[string][3]string{"steal": {"steal", "a|1", "false"}, "gone": {"gone", "a|1", "true"}}
	if len(got) != len(want) || got["steal"] != want["steal"] || got["gone"] != want["gone"] {
		t.Fatalf("told %v, want %v", got, want)
	}
	if rn.Held() != 1 {
		t.Fatalf("held %d", rn.Held())
	}
}

func TestIdempotencyClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := b.s.Keys().Idempotency("tenant", "k1")
	if r := b.do(t, &store.Op{Kind: store.OpClaim, JobID: "first", IdemKey: key}); r.Holder != "first" {
		t.Fatalf("first claim: %+v", r)
	}
	if r := b.do(t, &store.Op{Kind: store.OpClaim, JobID: "second", IdemKey: key}); r.Holder != "first" {
		t.Fatalf("second claim: %+v", r)
	}
}

func TestDecideApproval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.activate(t, "ap", "a", true)
	if err := b.s.Decide(ctx, "ap", store.DecisionApproved, "alice", "ok", ""); err == nil {
		t.Fatal("approved a job that is not waiting for approval")
	}
	r := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "ap", Node: "a", LockValue: "a|1", T: &store.Transition{
		Expect: jobstate.Expect(jobstate.StatePending), Path: []store.Hop{{To: jobstate.StateApprovalRequired, Reason: "approval_required"}},
		Release: true, Fields: []string{"job_hash", "h1"}}})
	if !r.OK() {
		t.Fatalf("%+v", r)
	}
	rec, _ := b.s.GetJob(ctx, "ap")
	if rec.LockHolder != "" {
		t.Fatal("passivating step kept the lock")
	}
	if err := b.s.Decide(ctx, "ap", store.DecisionApproved, "alice", "ok", "other"); err == nil {
		t.Fatal("approved with a hash that does not match")
	}
	if err := b.s.Decide(ctx, "ap", store.DecisionApproved, "alice", "ok", "h1"); err != nil {
		t.Fatal(err)
	}
	ids, err := b.s.DueJobs(ctx, time.Now().Add(time.Second), time.Now().Add(time.Minute), 10)
	if err != nil || len(ids) != 1 || ids[0] != "ap" {
		t.Fatalf("approved job not due: %v %v", ids, err)
	}
	// Offered once, then postponed.
	ids, _ = b.s.DueJobs(ctx, time.Now().Add(time.Second), time.Now().Add(time.Minute), 10)
	if len(ids) != 0 {
		t.Fatalf("due job offered twice in a row: %v", ids)
	}
}

func TestRenewerGivesUpAfterThreeFailedRenewals(t *testing.T) {
	t.Parallel()
	// A client to a port nothing listens on: every renewal fails.
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	defer dead.Close()
	s := store.New(dead, store.Config{Prefix: "x:"})
	rn := s.NewLockRenewer(nil)
	lost := make(chan struct{}, 1)
	rn.Hold("j", "a|1", func(bool) { lost <- struct{}{} })
	for i := 1; i <= store.MaxRenewFailures; i++ {
		select {
		case <-lost:
			t.Fatalf("lock reported lost after %d failures", i-1)
		default:
		}
		rn.RenewOnce(context.Background())
	}
	select {
	case <-lost:
	default:
		t.Fatalf("lock not reported lost after %d failures", store.MaxRenewFailures)
	}
	if st := rn.Stats(); st.Failed != store.MaxRenewFailures || st.Lost != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestTenantSlotRepairFindsTenantsByTheirAdmissions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	keys := b.s.Keys()
	// Two tenants take slots through the writer, as job actors do; one job
	// then ends without giving its slot back (its node died in between).
	for _, tc := range []struct{ id, tenant string }{{"ta-1", "acme"}, {"ta-2", "acme"}, {"tb-1", "bolt"}} {
		b.activate(t, tc.id, "a", true)
		if r := b.do(t, &store.Op{Kind: store.OpAdmit, JobID: tc.id, TenantKey: keys.TenantActive(tc.tenant), Limit: 10}); !r.Admitted {
			t.Fatalf("%s not admitted", tc.id)
		}
	}
	members, err := b.s.Client().SMembers(ctx, keys.Tenants()).Result()
	if err != nil || len(members) != 2 {
		t.Fatalf("tenants set %v (%v), want acme's and bolt's keys once each", members, err)
	}
	// ta-1 and tb-1 are PENDING (not running): their slots are stale.
	// ta-2 is RUNNING: its slot is in use and must stay.
	if err := b.s.Client().HSet(ctx, keys.Job("ta-2"), "s", string(jobstate.StateRunning)).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := b.s.RepairTenantSlots(ctx, 0, 100)
	if err != nil || n != 2 {
		t.Fatalf("repair gave back %d slots (%v), want 2 (ta-1, tb-1)", n, err)
	}
	if left, _ := b.s.Client().ZRange(ctx, keys.TenantActive("acme"), 0, -1).Result(); len(left) != 1 || left[0] != "ta-2" {
		t.Fatalf("acme's slots after repair %v, want [ta-2]", left)
	}
}

// TestTenantSlotAskedAgainIsRepairedByItsLastAsk: a job that asks again for
// the slot it holds keeps it with its score moved to the ask, so the repair
// (which frees slots by age) cannot free it within lifecycle.TenantSlotFresh
// of the ask that the job's dispatch is timed from.
func TestTenantSlotAskedAgainIsRepairedByItsLastAsk(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	keys := b.s.Keys()
	key := keys.TenantActive("again")
	b.activate(t, "tr-1", "a", true)
	admit := func() {
		t.Helper()
		if r := b.do(t, &store.Op{Kind: store.OpAdmit, JobID: "tr-1", TenantKey: key, Limit: 1}); !r.Admitted {
			t.Fatal("tr-1 not admitted")
		}
	}
	admit()
	// The slot was taken an hour ago (its holder's actor since lost).
	if err := b.s.Client().ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Add(-time.Hour).UnixMilli()), Member: "tr-1"}).Err(); err != nil {
		t.Fatal(err)
	}
	admit()
	// The job is SCHEDULED (not using its slot): only the slot's age keeps it.
	n, err := b.s.RepairTenantSlots(ctx, time.Minute, 100)
	if err != nil || n != 0 {
		t.Fatalf("repair gave back %d slots (%v), want 0: the job asked again now", n, err)
	}
	if left, _ := b.s.Client().ZRange(ctx, key, 0, -1).Result(); len(left) != 1 || left[0] != "tr-1" {
		t.Fatalf("slots after repair %v, want [tr-1]", left)
	}
}

func TestRenewerSeesRedisLoseItsData(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	lost := 0
	a := b.s.NewLockRenewer(nil)
	a.KeepNodeLease("a")
	a.OnDataLoss(func() { lost++ })
	other := b.s.NewLockRenewer(nil)
	other.KeepNodeLease("b")
	otherLost := 0
	other.OnDataLoss(func() { otherLost++ })
	a.RenewOnce(ctx)
	other.RenewOnce(ctx)
	a.RenewOnce(ctx)
	if lost != 0 || otherLost != 0 {
		t.Fatalf("losses before any: %d %d", lost, otherLost)
	}
	if n := b.s.Client().Exists(ctx, b.s.Keys().Epoch()).Val(); n != 1 {
		t.Fatal("no epoch key after a renewal")
	}
	b.s.Client().Del(ctx, b.s.Keys().Epoch())
	// The first renewer after the loss sets a new epoch and sees the loss;
	// the other sees a value it never saw before.
	other.RenewOnce(ctx)
	a.RenewOnce(ctx)
	a.RenewOnce(ctx)
	if lost != 1 || otherLost != 1 {
		t.Fatalf("losses seen: a %d, b %d; want 1 each", lost, otherLost)
	}
	// Lost again; the renewer that sees it first must not take its own new
	// write for the value it saw before.
	b.s.Client().Del(ctx, b.s.Keys().Epoch())
	a.RenewOnce(ctx)
	other.RenewOnce(ctx)
	if lost != 2 || otherLost != 2 {
		t.Fatalf("second loss seen: a %d, b %d; want 2 each", lost, otherLost)
	}
	// a wrote the value that is now lost, and sees it first.
	b.s.Client().Del(ctx, b.s.Keys().Epoch())
	a.RenewOnce(ctx)
	other.RenewOnce(ctx)
	if lost != 3 || otherLost != 3 {
		t.Fatalf("third loss seen: a %d, b %d; want 3 each", lost, otherLost)
	}
}

func TestExpiredLeasesSayWhenTheOwnersLockLapsed(t *testing.T) {
	t.Parallel()
	b := setup(t) // lock TTL 10 s
	ctx := context.Background()
	keys := b.s.Keys()
	deadline := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	b.s.Client().ZAdd(ctx, keys.Leases(store.Shard("orph")), redis.Z{Score: float64(deadline.UnixMilli()), Member: "orph"})
	b.s.Client().ZAdd(ctx, keys.Leases(store.Shard("alive")), redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: "alive"})
	next := time.Now().Add(5 * time.Second)
	got, err := b.s.ExpiredLeases(ctx, time.Now(), next, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].JobID != "orph" || !got[0].LapsedAt.Equal(deadline.Add(-10*time.Second)) {
		t.Fatalf("expired leases %+v, want orph lapsed at %v", got, deadline.Add(-10*time.Second))
	}
	if s := b.s.Client().ZScore(ctx, keys.Leases(store.Shard("orph")), "orph").Val(); int64(s) != next.UnixMilli() {
		t.Fatalf("lease moved to %v, want %v", int64(s), next.UnixMilli())
	}
	if again, _ := b.s.ExpiredLeases(ctx, time.Now(), next, 10); len(again) != 0 {
		t.Fatalf("offered again at once: %+v", again)
	}
}

// A transition's shard writes (a saga step's stack entry and template, a
// saga trigger) land in the job's shard in the same step, with their TTL;
// TrimBelow drops older entries first.
func TestSagaShardWritesOfATransitionExpire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, rdb, keys := context.Background(), b.s.Client(), b.s.Keys()
	b.activate(t, "sw", "a", true)
	tag := keys.Tag("sw")
	if err := rdb.ZAdd(ctx, tag+"trig", redis.Z{Score: 5, Member: "old"}, redis.Z{Score: 50, Member: "kept"}).Err(); err != nil {
		t.Fatal(err)
	}
	r := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "sw", Node: "a", LockValue: "a|1", T: &store.Transition{
		Expect: jobstate.Expect(jobstate.StatePending), Path: []store.Hop{{To: jobstate.StateSucceeded, Reason: "done"}},
		Adds: []store.ShardZAdd{{Suffix: "stack", Score: 100, Member: "sw", TTL: time.Hour},
			{Suffix: "trig", Score: 100, Member: "new", TrimBelow: 10, TTL: 2 * time.Hour}},
		Sets:   []store.ShardHSet{{Suffix: "tmpl", Field: "c:sw", Value: "raw", TTL: time.Hour}},
		Fields: []string{"worker", "w1"}}})
	if !r.OK() {
		t.Fatalf("transition: %+v", r)
	}
	if v, _ := rdb.HGet(ctx, tag+"tmpl", "c:sw").Result(); v != "raw" {
		t.Fatalf("hash field %q", v)
	}
	if m, _ := rdb.ZRange(ctx, tag+"trig", 0, -1).Result(); fmt.Sprint(m) != "[kept new]" {
		t.Fatalf("trimmed set %v", m)
	}
	for k, max := range map[string]time.Duration{"stack": time.Hour, "tmpl": time.Hour, "trig": 2 * time.Hour} {
		if ttl := rdb.PTTL(ctx, tag+k).Val(); ttl <= max-time.Minute || ttl > max {
			t.Errorf("%s: ttl %v, want about %v", k, ttl, max)
		}
	}
	if rec, _ := b.s.GetJob(ctx, "sw"); rec.Worker != "w1" || rec.State != jobstate.StateSucceeded {
		t.Fatalf("record %+v", rec)
	}
}

// TestRepairTenantSlotsKeepsSlotsOnReadError: when the job states the
// repair reads do not come back (a Redis timeout), it removes nothing — an
// unread state is not "not running" — and says so.
func TestRepairTenantSlotsKeepsSlotsOnReadError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	keys := b.s.Keys()
	for _, id := range []string{"run-1", "run-2"} {
		b.activate(t, id, "a", true)
		if r := b.do(t, &store.Op{Kind: store.OpAdmit, JobID: id, TenantKey: keys.TenantActive("acme"), Limit: 10}); !r.Admitted {
			t.Fatalf("%s not admitted", id)
		}
		if err := b.s.Client().HSet(ctx, keys.Job(id), "s", string(jobstate.StateRunning)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The state reads time out.
	hook := &faultHook{match: func(c redis.Cmder) bool { return isCmd(c, "hget", "job:run-") }}
	hook.on.Store(true)
	b.s.Client().AddHook(hook)
	n, err := b.s.RepairTenantSlots(ctx, 0, 100)
	if hook.hits.Load() == 0 {
		t.Fatal("no state read failed: the test injected nothing")
	}
	if left, _ := b.s.Client().ZCard(ctx, keys.TenantActive("acme")).Result(); left != 2 || n != 0 {
		t.Fatalf("repair with failed reads removed %d slots (%d left of 2)", n, left)
	}
	if err == nil {
		t.Fatal("repair with failed reads reported no error")
	}
	// Once Redis answers again the running jobs still keep their slots.
	hook.on.Store(false)
	if n, err := b.s.RepairTenantSlots(ctx, 0, 100); err != nil || n != 0 {
		t.Fatalf("repair removed %d (%v), want 0", n, err)
	}
}

// A terminal job's record has no expiry of its own: the retention trim
// (Store.TrimTerminal, run by the due poller) deletes it and its index
// entry once it ended before the cutoff, and leaves younger ones.
func TestRetentionTrimDeletesEndedRecordsAndTheirEntries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, id := range []string{"old1", "old2", "young"} {
		b.activate(t, id, "a", true)
		if sr := b.step(t, id, "a", 1, jobstate.StatePending, jobstate.StateFailed); sr.Step != store.StepOK {
			t.Fatalf("%s terminal: %+v", id, sr)
		}
	}
	cut := time.Now().Add(time.Hour)
	young := b.s.Keys().Index(store.Shard("young"), string(jobstate.StateFailed))
	if err := b.s.Client().ZAdd(ctx, young, redis.Z{Score: float64(cut.Add(time.Hour).UnixMilli()), Member: "young"}).Err(); err != nil {
		t.Fatal(err)
	}
	n, err := b.s.TrimTerminal(ctx, cut)
	if err != nil || n != 2 {
		t.Fatalf("trim: %d, %v; want 2 dropped", n, err)
	}
	for _, id := range []string{"old1", "old2"} {
		if _, err := b.s.GetJob(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s after the trim: %v, want not found", id, err)
		}
	}
	if rec, err := b.s.GetJob(ctx, "young"); err != nil || rec.State != jobstate.StateFailed {
		t.Fatalf("young after the trim: %+v %v", rec, err)
	}
	if c, _ := b.s.CountIndex(ctx, jobstate.StateFailed); c != 1 {
		t.Fatalf("FAILED index holds %d entries after the trim, want 1", c)
	}
	if n, err := b.s.TrimTerminal(ctx, cut); err != nil || n != 0 {
		t.Fatalf("second trim: %d, %v; want 0", n, err)
	}
}
