package store_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// idsOfShard returns n job ids (prefix + a number) of one shard.
func idsOfShard(prefix string, n int) []string {
	var out []string
	sh := -1
	for i := 0; len(out) < n; i++ {
		id := prefix + strconv.Itoa(i)
		if sh == -1 {
			sh = store.Shard(id)
		}
		if store.Shard(id) == sh {
			out = append(out, id)
		}
	}
	return out
}

// A job's lease is a member of its shard's due set: the create writes it
// with the due entry, the terminal write drops both, the lease set of the
// version before stays untouched; the due poller never offers a lease as
// a job, and ExpiredLeases offers it by its job's id.
func TestLeaseIsAMemberOfTheDueSet(t *testing.T) {
	t.Parallel()
	b := setup(t) // lock TTL 10 s
	ctx := context.Background()
	rdb, keys := b.s.Client(), b.s.Keys()
	before := time.Now()
	deadline := b.dispatch(t, "ld1", "a")
	sh := store.Shard("ld1")
	lease, err := rdb.ZScore(ctx, keys.Due(sh), store.LeaseMember("ld1")).Result()
	if err != nil {
		t.Fatalf("no lease in the due set: %v", err)
	}
	if min := before.Add(20 * time.Second).UnixMilli(); int64(lease) < min || int64(lease) > time.Now().Add(20*time.Second).UnixMilli() {
		t.Fatalf("lease %d, want two lock TTLs from the create (%d)", int64(lease), min)
	}
	if due, _ := b.s.DueAt(ctx, "ld1"); !due.Equal(deadline) {
		t.Fatalf("due %v, want %v", due, deadline)
	}
	if n := rdb.Exists(ctx, keys.Leases(sh)).Val(); n != 0 {
		t.Fatal("the lease set of the version before was written")
	}
	// Past both the lease and the deadline: the poller gets the job once,
	// as a due job, and once as an orphan, each by its id.
	later := time.Now().Add(2 * time.Hour)
	dueIDs, err := b.s.DueJobs(ctx, later, later.Add(time.Hour), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dueIDs) != 1 || dueIDs[0] != "ld1" {
		t.Fatalf("due jobs %q, want [ld1]", dueIDs)
	}
	orphans, err := b.s.ExpiredLeases(ctx, later, later.Add(time.Hour), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) != 1 || orphans[0].JobID != "ld1" || !orphans[0].LapsedAt.Equal(time.UnixMilli(int64(lease)).Add(-10*time.Second)) {
		t.Fatalf("orphans %+v, want ld1 lapsed at %v", orphans, time.UnixMilli(int64(lease)).Add(-10*time.Second))
	}
	// The terminal write drops the due entry and the lease.
	r := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "ld1", Node: "a", LockValue: jobstate.LockValue("a", 1),
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StateDispatched),
			Path: []store.Hop{{To: jobstate.StateSucceeded, Reason: "r"}}}})
	if !r.OK() {
		t.Fatalf("terminal write: %+v", r)
	}
	if n := rdb.ZCard(ctx, keys.Due(sh)).Val(); n != 0 {
		t.Fatalf("due set holds %d members after the job ended: %v", n, rdb.ZRange(ctx, keys.Due(sh), 0, -1).Val())
	}
}

// Leases in front of the due entries in a shard's due set do not hide the
// due entries from the poller, nor due entries the leases from
// ExpiredLeases (each looks past up to 8 × its limit of the other's).
func TestLeaseMembersDoNotStarveTheDuePoller(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rdb, keys := b.s.Client(), b.s.Keys()
	ids := idsOfShard("st", 8)
	due := keys.Due(store.Shard(ids[0]))
	old := time.Now().Add(-time.Hour).UnixMilli()
	for i, id := range ids[:6] {
		rdb.ZAdd(ctx, due, redis.Z{Score: float64(old + int64(i)), Member: store.LeaseMember(id)})
	}
	rdb.ZAdd(ctx, due, redis.Z{Score: float64(old + 10), Member: ids[6]})
	rdb.ZAdd(ctx, due, redis.Z{Score: float64(old - 10), Member: ids[7]})
	next := time.Now().Add(time.Minute)
	got, err := b.s.DueJobs(ctx, time.Now(), next, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != ids[7] {
		t.Fatalf("due jobs %q, want [%s]", got, ids[7])
	}
	if got, _ = b.s.DueJobs(ctx, time.Now(), next, 1); len(got) != 1 || got[0] != ids[6] {
		t.Fatalf("due jobs %q behind 6 leases, want [%s]", got, ids[6])
	}
	orphans, err := b.s.ExpiredLeases(ctx, time.Now(), next, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) != 2 || orphans[0].JobID != ids[0] || orphans[1].JobID != ids[1] {
		t.Fatalf("orphans %+v, want %s and %s", orphans, ids[0], ids[1])
	}
	if s := rdb.ZScore(ctx, due, store.LeaseMember(ids[0])).Val(); int64(s) != next.UnixMilli() {
		t.Fatalf("offered lease moved to %d, want %d", int64(s), next.UnixMilli())
	}
	if s := rdb.ZScore(ctx, due, store.LeaseMember(ids[2])).Val(); int64(s) != old+2 {
		t.Fatalf("a lease not offered moved to %d", int64(s))
	}
}

// A rolling upgrade: a job whose lock a node of the version before held,
// with its lease in the lease set of that version, is offered when that
// lease lapses; adopting it moves the lease into the due set and drops
// the old entry, and the adopter's terminal write leaves neither.
func TestLeaseOfANodeOfTheVersionBeforeIsAdopted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rdb, keys := b.s.Client(), b.s.Keys()
	b.dispatch(t, "up1", "old")
	sh := store.Shard("up1")
	// What the old node's scripts would have left: the lease in the lease
	// set, none in the due set; the old node died and its lock lapsed.
	lapsed := time.Now().Add(-time.Second).UnixMilli()
	rdb.ZRem(ctx, keys.Due(sh), store.LeaseMember("up1"))
	rdb.ZAdd(ctx, keys.Leases(sh), redis.Z{Score: float64(lapsed), Member: "up1"})
	rdb.Del(ctx, keys.Lock("up1"))
	orphans, err := b.s.ExpiredLeases(ctx, time.Now(), time.Now().Add(time.Minute), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) != 1 || orphans[0].JobID != "up1" {
		t.Fatalf("orphans %+v, want up1 from the old lease set", orphans)
	}
	r := b.activate(t, "up1", "new", false)
	if r.Status != store.ActivateAdopted {
		t.Fatalf("adoption: %+v", r)
	}
	if _, err := rdb.ZScore(ctx, keys.Leases(sh), "up1").Result(); err != redis.Nil {
		t.Fatalf("the old lease entry is left after the adoption (%v)", err)
	}
	if _, err := rdb.ZScore(ctx, keys.Due(sh), store.LeaseMember("up1")).Result(); err != nil {
		t.Fatalf("the adopter's lease is not in the due set: %v", err)
	}
	r = b.do(t, &store.Op{Kind: store.OpTransition, JobID: "up1", Node: "new", LockValue: jobstate.LockValue("new", r.Fence),
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StateDispatched),
			Path: []store.Hop{{To: jobstate.StateFailed, Reason: "r"}}}})
	if !r.OK() {
		t.Fatalf("terminal write: %+v", r)
	}
	if n := rdb.ZCard(ctx, keys.Due(sh)).Val() + rdb.ZCard(ctx, keys.Leases(sh)).Val(); n != 0 {
		t.Fatalf("%d due or lease entries left after the job ended", n)
	}
}
