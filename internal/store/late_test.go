package store_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}
func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// A renewer is late while some live lock has gone unrenewed for longer
// than LateAfter, and catches up when a round answers every lock it holds;
// a round that cannot reach Redis does not catch it up.
func TestRenewerIsLateUntilARoundAnswersEveryLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.activate(t, "late-1", "a", true)
	rn := b.s.NewLockRenewer(nil)
	clock := newFakeClock()
	rn.SetClock(clock.now)

	clock.advance(2 * rn.LateAfter())
	if rn.Late() {
		t.Fatal("late with no live lock")
	}
	rn.Hold("late-1", "a|1", func(bool) { t.Error("lock reported lost") })
	if rn.Late() {
		t.Fatal("late right after the first lock was registered")
	}
	clock.advance(rn.LateAfter())
	if rn.Late() {
		t.Fatal("late at exactly LateAfter")
	}
	clock.advance(time.Millisecond)
	if !rn.Late() {
		t.Fatal("not late past LateAfter with no renewal")
	}
	rn.RenewOnce(ctx)
	if rn.Late() {
		t.Fatal("still late after a round renewed every lock")
	}
	if st := rn.Stats(); st.Renewed != 1 || st.Lost != 0 {
		t.Fatalf("stats %+v", st)
	}

	// The same lock in a renewer whose Redis is unreachable: its rounds
	// fail, and it stays late.
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	defer dead.Close()
	off := store.New(dead, store.Config{Prefix: "x:"}).NewLockRenewer(nil)
	offClock := newFakeClock()
	off.SetClock(offClock.now)
	off.Hold("j", "a|1", func(bool) {})
	offClock.advance(off.LateAfter() + time.Millisecond)
	off.RenewOnce(ctx)
	if !off.Late() {
		t.Fatal("caught up by a round that could not reach Redis")
	}
}

// A round renews every lock whatever their number, in pipelines of at most
// RenewPipelineCalls calls. A round is bounded by the renewal interval (a
// third of the lock TTL), and the locks it has not sent by then count
// failed: with setup's 10 s TTL that bound (3.3 s) cut a round of these
// 10,000 renewals on an embedded Redis at load ~50 (2,513 failed), so this
// store's TTL leaves the round a minute.
func TestRenewerRenewsManyLocksInBoundedPipelines(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	b := &bundle{s: store.New(env.Client, store.Config{Prefix: env.KeyPrefix(), LockTTL: 3 * time.Minute})}
	ctx := context.Background()
	if err := b.s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := b.s.Client()
	// Spread over every shard: one call per shard, Shards/RenewPipelineCalls
	// pipelines.
	n := store.RenewBatch * (store.RenewPipelineCalls + 2)
	pipe := rdb.Pipeline()
	rn := b.s.NewLockRenewer(nil)
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("many-%d", i)
		pipe.Set(ctx, b.s.Keys().Lock(id), "a|1", 5*time.Second)
		rn.Hold(id, "a|1", func(bool) { t.Errorf("lock %s reported lost", id) })
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	rn.RenewOnce(ctx)
	st := rn.Stats()
	if st.Renewed != uint64(n) || st.Lost != 0 || st.Failed != 0 {
		t.Fatalf("stats %+v, want %d renewed", st, n)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		if ttl := rdb.PTTL(ctx, b.s.Keys().Lock(fmt.Sprintf("many-%d", i))).Val(); ttl < 6*time.Second {
			t.Fatalf("lock many-%d not renewed: ttl %v", i, ttl)
		}
	}
}
