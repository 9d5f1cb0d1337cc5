package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// dispatch creates id on node and moves it to DISPATCHED with a deadline in
// an hour; it returns the deadline.
func (b *bundle) dispatch(t *testing.T, id, node string) time.Time {
	t.Helper()
	b.activate(t, id, node, true)
	deadline := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	r := b.do(t, &store.Op{Kind: store.OpTransition, JobID: id, Node: node, LockValue: jobstate.LockValue(node, 1),
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StatePending), Due: deadline.UnixMilli(),
			Path:   []store.Hop{{To: jobstate.StateScheduled, Reason: "r"}, {To: jobstate.StateDispatched, Reason: "r"}},
			Fields: []string{"deadline", time.Now().Add(time.Hour).Format("x")}}})
	if !r.OK() {
		t.Fatalf("dispatch %s: %+v", id, r)
	}
	// The record's deadline field, as the job actor writes it.
	b.s.Client().HSet(context.Background(), b.s.Keys().Job(id), "deadline", deadline.UnixMilli())
	return deadline
}

func (b *bundle) park(t *testing.T, id, node string, fence int64, due time.Time) *store.Result {
	return b.do(t, &store.Op{Kind: store.OpPark, JobID: id, Node: node, LockValue: jobstate.LockValue(node, fence),
		ParkDue: due.UnixMilli()})
}

// startLease keeps node's lease as a node does (renewer with KeepNodeLease).
func (b *bundle) startLease(t *testing.T, node string) *store.LockRenewer {
	t.Helper()
	rn := b.s.NewLockRenewer(nil)
	rn.KeepNodeLease(node)
	rn.Start()
	return rn
}

func TestParkedLockIsHeldByTheNodeLeaseAndAdoptedWhenItLapses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rdb, keys := b.s.Client(), b.s.Keys()
	rn := b.startLease(t, "a")
	defer rn.Stop()
	deadline := b.dispatch(t, "p1", "a")
	if r := b.park(t, "p1", "a", 1, deadline); !r.Parked {
		t.Fatalf("park: %+v", r)
	}
	sh := store.Shard("p1")
	if v, ttl := rdb.Get(ctx, keys.Lock("p1")).Val(), rdb.PTTL(ctx, keys.Lock("p1")).Val(); v != "a|1|p" || ttl != -1 {
		t.Fatalf("parked lock %q ttl %v", v, ttl)
	}
	if _, err := rdb.ZScore(ctx, keys.Due(sh), store.LeaseMember("p1")).Result(); err != redis.Nil {
		t.Fatalf("a parked job still has a per-job lease (%v)", err)
	}
	if due, _ := b.s.DueAt(ctx, "p1"); !due.IsZero() {
		t.Fatal("a parked job is still in the due set, where another node's poller would wake it")
	}
	if s := rdb.ZScore(ctx, keys.Parked(sh, "a"), "p1").Val(); int64(s) != deadline.UnixMilli() {
		t.Fatalf("parked score %v, want the deadline %v", s, deadline.UnixMilli())
	}
	// Parking twice, or with a stale fence, is refused.
	if r := b.park(t, "p1", "a", 1, deadline); r.Parked {
		t.Fatal("parked a lock that was already parked")
	}
	// While a's lease lives, the job is a's.
	if r := b.activate(t, "p1", "b", false); r.Status != store.ActivateBusy || r.Holder != "a|1|p" {
		t.Fatalf("activation by b while a is alive: %+v", r)
	}
	// a dies: its lease expires (deleting the keys is what expiry does).
	rn.Stop()
	for i := 0; i < store.Shards; i++ {
		rdb.Del(ctx, keys.Alive(i, "a"))
	}
	r := b.activate(t, "p1", "b", false)
	if r.Status != store.ActivateAdopted || r.Fence != 2 || r.Holder != "a|1|p" || r.State != jobstate.StateDispatched {
		t.Fatalf("adoption by b: %+v", r)
	}
	if v, ttl := rdb.Get(ctx, keys.Lock("p1")).Val(), rdb.PTTL(ctx, keys.Lock("p1")).Val(); v != "b|2" || ttl <= 0 {
		t.Fatalf("adopted lock %q ttl %v", v, ttl)
	}
	if n := rdb.ZCard(ctx, keys.Parked(sh, "a")).Val(); n != 0 {
		t.Fatalf("adopted job left in the dead node's parked set (%d)", n)
	}
	if due, _ := b.s.DueAt(ctx, "p1"); due.UnixMilli() != deadline.UnixMilli() {
		t.Fatalf("deadline not back in the due set: %v", due)
	}
	// The dead owner's writes are fenced.
	if sr := b.step(t, "p1", "a", 1, jobstate.StateDispatched, jobstate.StateSucceeded); sr.Step != store.StepFenced {
		t.Fatalf("old owner's write: %+v", sr)
	}
}

func TestOwnerUnparksItsOwnJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rn := b.startLease(t, "a")
	defer rn.Stop()
	deadline := b.dispatch(t, "p2", "a")
	b.park(t, "p2", "a", 1, deadline)
	r := b.activate(t, "p2", "a", false)
	if r.Status != store.ActivateAdopted || r.Fence != 2 || !strings.HasSuffix(r.Holder, "|p") {
		t.Fatalf("re-activation by the owner: %+v", r)
	}
	if sr := b.step(t, "p2", "a", 2, jobstate.StateDispatched, jobstate.StateSucceeded); sr.Step != store.StepOK {
		t.Fatalf("owner's write after unparking: %+v", sr)
	}
	if n, _ := b.s.ParkedCount(ctx, "a"); n != 0 {
		t.Fatalf("parked count %d after the job ended", n)
	}
}

func TestOwnParkedJobsAreDueAtTheirDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rn := b.startLease(t, "a")
	defer rn.Stop()
	b.dispatch(t, "soon", "a")
	b.dispatch(t, "later", "a")
	b.park(t, "soon", "a", 1, time.Now().Add(-time.Second))
	b.park(t, "later", "a", 1, time.Now().Add(time.Hour))
	ids, err := b.s.ParkedDue(ctx, "a", time.Now(), time.Now().Add(time.Minute), 10)
	if err != nil || len(ids) != 1 || ids[0] != "soon" {
		t.Fatalf("due parked jobs %v (%v)", ids, err)
	}
	if ids, _ := b.s.ParkedDue(ctx, "a", time.Now(), time.Now().Add(time.Minute), 10); len(ids) != 0 {
		t.Fatalf("offered twice in a row: %v", ids)
	}
}

func TestDeadNodeIsAdoptedThenForgotten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rn := b.startLease(t, "a")
	for _, id := range []string{"d1", "d2", "d3"} {
		b.park(t, id, "a", 1, b.dispatch(t, id, "a"))
	}
	// A graceful stop gives the lease up: a is dead at once.
	rn.Stop()
	if v := b.s.Client().Exists(ctx, b.s.Keys().Alive(store.Shard("d1"), "a")).Val(); v != 0 {
		t.Fatal("alive key left after a graceful stop")
	}
	now := time.Now()
	dead, err := b.s.DeadNodes(ctx, now.Add(-b.s.LockTTL()), 8)
	if err != nil || len(dead) != 1 || dead[0].Node != "a" || dead[0].Adopting {
		t.Fatalf("dead nodes %+v (%v)", dead, err)
	}
	if ok, err := b.s.StartAdoption(ctx, "a", now.Add(-b.s.LockTTL())); !ok || err != nil {
		t.Fatalf("start adoption: %v %v", ok, err)
	}
	// Every parked job is offered at once, whatever its deadline, then not again.
	ids, _ := b.s.ParkedDue(ctx, "a", now, now.Add(time.Minute), 10)
	if len(ids) != 3 {
		t.Fatalf("offered %v", ids)
	}
	if again, _ := b.s.ParkedDue(ctx, "a", now, now.Add(time.Minute), 10); len(again) != 0 {
		t.Fatalf("offered again at once: %v", again)
	}
	for _, id := range ids {
		if r := b.activate(t, id, "b", false); r.Status != store.ActivateAdopted {
			t.Fatalf("adopt %s: %+v", id, r)
		}
	}
	if n, _ := b.s.ParkedCount(ctx, "a"); n != 0 {
		t.Fatalf("%d parked left", n)
	}
	if err := b.s.ForgetNode(ctx, "a", now.Add(-b.s.LockTTL())); err != nil {
		t.Fatal(err)
	}
	if dead, _ := b.s.DeadNodes(ctx, time.Now(), 8); len(dead) != 0 {
		t.Fatalf("forgotten node still listed: %+v", dead)
	}
}

func TestLiveNodeIsNeitherAdoptedNorForgotten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rn := b.startLease(t, "a")
	defer rn.Stop()
	cutoff := time.Now().Add(-b.s.LockTTL())
	if dead, _ := b.s.DeadNodes(ctx, cutoff, 8); len(dead) != 0 {
		t.Fatalf("a live node listed dead: %+v", dead)
	}
	if ok, _ := b.s.StartAdoption(ctx, "a", cutoff); ok {
		t.Fatal("adoption of a live node started")
	}
	_ = b.s.ForgetNode(ctx, "a", cutoff)
	if n := b.s.Client().ZCard(ctx, b.s.Keys().Nodes()).Val(); n != 1 {
		t.Fatal("a live node was forgotten")
	}
	// Renewal covers any number of parked locks with the same commands.
	before := rn.Stats().Calls
	rn.RenewOnce(ctx)
	if got := rn.Stats().Calls - before; got != store.Shards+1 {
		t.Fatalf("lease renewal sent %d commands, want %d", got, store.Shards+1)
	}
}
