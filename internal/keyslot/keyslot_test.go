package keyslot_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/keyslot"
	"github.com/troupe-run/troupe/internal/testenv"
)

func acquire(t *testing.T, s *keyslot.Slots, key, job string, limit int, st keyslot.Strategy) keyslot.Result {
	t.Helper()
	r, err := s.Acquire(context.Background(), key, job, limit, st, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A key's slots are exact: a job over the limit waits in the key's line,
// a holder asking again keeps its slot, and a freed slot is announced on
// the wake channel for the key.
func TestConcurrencyKeySlotsAreExactAndAFreedSlotIsAnnounced(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	s := keyslot.New(env.Client, env.KeyPrefix())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	woken := make(chan string, 10)
	subscribed := make(chan struct{})
	go func() { _ = s.Subscribe(ctx, func(k, _ string) { woken <- k }) }()
	// The subscription is live once a publish reaches it.
	go func() {
		for i := 0; i < 500 && ctx.Err() == nil; i++ {
			select {
			case <-subscribed:
				return
			default:
			}
			env.Client.Publish(ctx, s.Wakes(), "probe")
			time.Sleep(10 * time.Millisecond)
		}
	}()
	if k := <-woken; k != "probe" {
		t.Fatalf("woken for %q", k)
	}
	close(subscribed)
	for _, j := range []string{"j1", "j2"} {
		if r := acquire(t, s, "u", j, 2, keyslot.Queue); r.Outcome != keyslot.Admitted {
			t.Fatalf("%s: %+v", j, r)
		}
	}
	if r := acquire(t, s, "u", "j1", 2, keyslot.Queue); r.Outcome != keyslot.Admitted || r.Holders != 2 {
		t.Fatalf("holder asking again: %+v", r)
	}
	if r := acquire(t, s, "u", "j3", 2, keyslot.Queue); r.Outcome != keyslot.Waiting || r.Waiters != 1 {
		t.Fatalf("j3: %+v", r)
	}
	if r := acquire(t, s, "u", "j4", 2, keyslot.CancelNewest); r.Outcome != keyslot.Refused || r.Waiters != 1 {
		t.Fatalf("j4 (cancel_newest): %+v", r)
	}
	if freed, err := s.Release(ctx, "u", "j1", time.Time{}, 0); err != nil || !freed {
		t.Fatalf("release: %v %v", freed, err)
	}
	k := "probe"
	for i := 0; k == "probe" && i < 1000; i++ { // the probes sent before the close
		k = <-woken
	}
	if k != "u" {
		t.Fatalf("woken for %q", k)
	}
	if r := acquire(t, s, "u", "j3", 2, keyslot.Queue); r.Outcome != keyslot.Admitted || r.Waiters != 0 {
		t.Fatalf("j3 after the release: %+v", r)
	}
	st, err := s.Stats(ctx, 0)
	if err != nil || len(st) != 1 || st[0] != (keyslot.Stat{Key: "u", Holders: 2}) {
		t.Fatalf("stats %+v %v", st, err)
	}
}

// cancel_in_progress names the oldest holder and puts the new job first
// in line; the holder's slot, released lingering, stays counted until its
// time, then is free.
func TestConcurrencyKeyCancelInProgressNamesTheOldestAndItsSlotLingers(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	s := keyslot.New(env.Client, env.KeyPrefix())
	ctx := context.Background()
	now := time.Now()
	if _, err := s.Acquire(ctx, "k", "old", 1, keyslot.Queue, now.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, "k", "queued", 1, keyslot.Queue)
	r := acquire(t, s, "k", "new", 1, keyslot.CancelInProgress)
	if r.Outcome != keyslot.Waiting || r.Victim != "old" {
		t.Fatalf("new: %+v", r)
	}
	first, _ := env.Client.ZRange(ctx, s.Waiters("k"), 0, 0).Result()
	if len(first) != 1 || first[0] != "new" {
		t.Fatalf("first in line %v", first)
	}
	until := time.Now().Add(300 * time.Millisecond)
	if _, err := s.Release(ctx, "k", "old", until, 0); err != nil {
		t.Fatal(err)
	}
	if r := acquire(t, s, "k", "new", 1, keyslot.CancelInProgress); r.Outcome != keyslot.Waiting || r.Victim != "" {
		t.Fatalf("new while old lingers: %+v", r)
	}
	time.Sleep(time.Until(until) + 50*time.Millisecond)
	if r := acquire(t, s, "k", "new", 1, keyslot.CancelInProgress); r.Outcome != keyslot.Admitted {
		t.Fatalf("new after old's linger: %+v", r)
	}
}

// The repair frees slots of jobs no longer with a worker and drops the
// waits of ended jobs; it leaves running jobs' slots alone.
func TestConcurrencyKeyRepairFreesSlotsOfEndedJobs(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	s := keyslot.New(env.Client, env.KeyPrefix())
	ctx := context.Background()
	old := time.Now().Add(-time.Hour)
	for _, j := range []string{"running", "ended"} {
		if _, err := s.Acquire(ctx, "k", j, 2, keyslot.Queue, old); err != nil {
			t.Fatal(err)
		}
	}
	acquire(t, s, "k", "gone", 2, keyslot.Queue)
	states := map[string]string{"running": "RUNNING", "ended": "SUCCEEDED"}
	freed, err := s.Repair(ctx, time.Minute, 100, func(_ context.Context, ids []string) ([]string, error) {
		out := make([]string, len(ids))
		for i, id := range ids {
			out[i] = states[id]
		}
		return out, nil
	}, nil)
	if err != nil || freed != 1 {
		t.Fatalf("repair freed %d, %v", freed, err)
	}
	held, _ := env.Client.ZRange(ctx, s.Holders("k"), 0, -1).Result()
	waiting, _ := env.Client.ZCard(ctx, s.Waiters("k")).Result()
	if len(held) != 1 || held[0] != "running" || waiting != 0 {
		t.Fatalf("held %v, %d waiting", held, waiting)
	}
}

// A bad key is refused with a clear error, never taken.
func TestConcurrencyKeyBadKeysAreRefused(t *testing.T) {
	for _, k := range []string{"", "a{b}", "x\n", string(make([]byte, keyslot.MaxKeyLen+1))} {
		if keyslot.CheckKey(k) == nil {
			t.Fatalf("key %q accepted", k)
		}
	}
	if _, err := keyslot.ParseStrategy("lifo"); err == nil {
		t.Fatal("strategy lifo accepted")
	}
}

// A slot lingering after its job ended stays counted apart from the job:
// the same job asking again (its record re-created, a later run) does not
// take it over and has no slot while it lingers, and a release without a
// linger (that later run ending) does not free it early. A lingering slot
// written under the job's own member (an older release) is kept the same
// way.
func TestConcurrencyKeyLingeringSlotIsNotTakenOverByALaterRunOfItsJob(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	s := keyslot.New(env.Client, env.KeyPrefix())
	ctx := context.Background()
	acquire(t, s, "k", "j", 1, keyslot.Queue)
	until := time.Now().Add(time.Hour)
	if freed, err := s.Release(ctx, "k", "j", until, 0); err != nil || freed {
		t.Fatalf("release lingering: %v %v", freed, err)
	}
	if r := acquire(t, s, "k", "j", 1, keyslot.CancelInProgress); r.Outcome != keyslot.Waiting || r.Victim != "" || r.Holders != 1 {
		t.Fatalf("j again while its slot lingers: %+v", r)
	}
	if freed, err := s.Release(ctx, "k", "j", time.Time{}, 0); err != nil || freed {
		t.Fatalf("release of the later run freed the lingering slot: %v %v", freed, err)
	}
	if r := acquire(t, s, "k", "other", 1, keyslot.Queue); r.Outcome != keyslot.Waiting {
		t.Fatalf("other while j's slot lingers: %+v", r)
	}
	st, err := s.Stats(ctx, 0)
	if err != nil || len(st) != 1 || st[0] != (keyslot.Stat{Key: "k", Holders: 1, Lingering: 1, Waiters: 1}) {
		t.Fatalf("stats %+v %v", st, err)
	}

	// The older form: the lingering slot under the job's own member.
	if err := env.Client.ZAdd(ctx, s.Holders("old"), redis.Z{Score: -float64(until.UnixMilli()), Member: "j"}).Err(); err != nil {
		t.Fatal(err)
	}
	if r := acquire(t, s, "old", "j", 1, keyslot.Queue); r.Outcome != keyslot.Waiting || r.Holders != 1 {
		t.Fatalf("j again while its older-form slot lingers: %+v", r)
	}
	if freed, _ := s.Release(ctx, "old", "j", time.Time{}, 0); freed {
		t.Fatal("release freed the older-form lingering slot")
	}
	if n, _ := env.Client.ZCount(ctx, s.Holders("old"), "-inf", "(0").Result(); n != 1 {
		t.Fatalf("%d lingering slots of key old; want 1", n)
	}
}

// A freed slot goes to the key's oldest waiter: the release script moves
// it into the holders and names it in the notice ("key\njob"); a waiter of
// cancel_in_progress (first in line) comes before older ones; lapsed
// lingering slots are dropped first, a live one still counts; a key whose
// holders are at the limit hands nothing on.
func TestConcurrencyKeyReleaseHandsTheSlotToTheOldestWaiter(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	s := keyslot.New(env.Client, env.KeyPrefix())
	ctx := context.Background()
	sub := env.Client.Subscribe(ctx, s.Wakes())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	notices := sub.Channel()
	next := func() string {
		t.Helper()
		select {
		case m := <-notices:
			return m.Payload
		case <-time.After(10 * time.Second):
			t.Fatal("no notice")
			return ""
		}
	}
	t0 := time.Now()
	for i, j := range []string{"h1", "h2", "w1", "w2", "w3"} {
		if _, err := s.Acquire(ctx, "k", j, 2, keyslot.Queue, t0.Add(time.Duration(i)*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	if freed, err := s.Release(ctx, "k", "h1", time.Time{}, 2); err != nil || !freed {
		t.Fatalf("release h1: %v %v", freed, err)
	}
	if p := next(); p != "k\nw1" {
		t.Fatalf("notice %q, want the oldest waiter w1 named", p)
	}
	held, _ := env.Client.ZRange(ctx, s.Holders("k"), 0, -1).Result()
	waiting, _ := env.Client.ZRange(ctx, s.Waiters("k"), 0, -1).Result()
	if len(held) != 2 || !slices.Contains(held, "w1") || !slices.Contains(held, "h2") || !slices.Equal(waiting, []string{"w2", "w3"}) {
		t.Fatalf("after the hand-off: held %v, waiting %v", held, waiting)
	}
	// w1 asking now keeps the slot it was handed (no second slot).
	if r := acquire(t, s, "k", "w1", 2, keyslot.Queue); r.Outcome != keyslot.Admitted || r.Holders != 2 {
		t.Fatalf("w1 asking: %+v", r)
	}
	// cancel_in_progress: the newcomer waits first in line.
	if r := acquire(t, s, "k", "cip", 2, keyslot.CancelInProgress); r.Outcome != keyslot.Waiting {
		t.Fatalf("cip: %+v", r)
	}
	// h2 ends cancelled with its worker: its slot lingers (counted), no hand-off.
	if freed, err := s.Release(ctx, "k", "h2", time.Now().Add(time.Hour), 2); err != nil || freed {
		t.Fatalf("lingering release: %v %v", freed, err)
	}
	if freed, err := s.Release(ctx, "k", "w1", time.Time{}, 2); err != nil || !freed {
		t.Fatalf("release w1: %v %v", freed, err)
	}
	if p := next(); p != "k\ncip" {
		t.Fatalf("notice %q, want cancel_in_progress's waiter named", p)
	}
	if n, _ := env.Client.ZCard(ctx, s.Holders("k")).Result(); n != 2 {
		t.Fatalf("%d holders with h2's slot lingering, want 2", n)
	}
	// A release with no limit given names nobody: the key alone.
	if freed, err := s.Release(ctx, "k", "cip", time.Time{}, 0); err != nil || !freed {
		t.Fatalf("release cip: %v %v", freed, err)
	}
	if p := next(); p != "k" {
		t.Fatalf("notice %q, want the key alone", p)
	}
	if w, _ := env.Client.ZCard(ctx, s.Waiters("k")).Result(); w != 2 {
		t.Fatalf("%d waiting, want w2 and w3 still waiting", w)
	}
}
