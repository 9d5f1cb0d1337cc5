package store

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/testenv"
)

// A renewal that finds a lock gone while a write giving that lock up is in
// flight drops the lock without a loss report: the write's own reply tells
// the job. Without such a write, the same refusal is a loss.
func TestRenewalRefusedDuringItsOwnReleaseIsNoLoss(t *testing.T) {
	env, s, rn := renewerStore(t)
	ctx := context.Background()
	lost := make(chan string, 2)
	for _, id := range []string{"releasing", "plain"} {
		rn.Hold(id, "n|1", func(bool) { lost <- id })
	}
	// Both locks are gone from Redis; only "releasing" has a write in
	// flight that gives it up (the Writer marks it as it sends the write).
	release := &Op{Kind: OpRelease, JobID: "releasing", LockValue: "n|1"}
	s.markReleasing([]*Op{release}, true)
	rn.RenewOnce(ctx)
	select {
	case id := <-lost:
		if id != "plain" {
			t.Fatalf("lock %s reported lost", id)
		}
	default:
		t.Fatal("the lock with no write in flight was not reported lost")
	}
	select {
	case id := <-lost:
		t.Fatalf("lock %s reported lost", id)
	default:
	}
	if rn.Held() != 0 {
		t.Fatalf("%d locks still registered, want none", rn.Held())
	}
	if st := rn.Stats(); st.Lost != 1 || st.Refused != 1 {
		t.Fatalf("stats %+v, want one refusal, one loss", st)
	}

	// A write that gives its lock up unregisters it when it applies; one
	// that does not apply leaves it registered, unmarked.
	if err := env.Client.Set(ctx, s.Keys().Lock("kept"), "n|2", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	rn.Hold("kept", "n|2", func(bool) { lost <- "kept" })
	rn.Hold("let-go", "n|3", func(bool) { lost <- "let-go" })
	fenced := &Op{Kind: OpRelease, JobID: "kept", LockValue: "n|2"}
	applied := &Op{Kind: OpRelease, JobID: "let-go", LockValue: "n|3"}
	s.markReleasing([]*Op{fenced, applied}, true)
	s.settleReleasing([]*Op{fenced, applied}, []*Result{{Released: false}, {Released: true}})
	if rn.Held() != 1 {
		t.Fatalf("%d locks registered, want only the one whose release did not apply", rn.Held())
	}
	rn.RenewOnce(ctx)
	if st := rn.Stats(); st.Renewed != 1 {
		t.Fatalf("stats %+v, want the kept lock renewed", st)
	}
}

// An Op's Held reaches its own registration only, as a look-up of its job
// and lock value would: a handle from an earlier Hold of the job (another
// value) neither marks nor forgets the lock held now; the handle of the
// lock held now marks it (a renewal refused meanwhile is no loss), unmarks
// it when its write does not apply, and forgets it when it does.
func TestHeldLockHandleReachesOnlyItsOwnRegistration(t *testing.T) {
	_, s, rn := renewerStore(t)
	ctx := context.Background()
	lost := make(chan string, 4)
	loser := lostFunc(func(bool) { lost <- "j" })
	old := rn.HoldFor("j", "n|1", loser)
	h := rn.HoldFor("j", "n|2", loser)
	if rn.Held() != 1 || old.live || !h.live {
		t.Fatalf("held %d, old live %v, new live %v: want 1, false, true", rn.Held(), old.live, h.live)
	}
	rn.ForgetHeld(old)
	if rn.Held() != 1 || !h.live {
		t.Fatal("a stale handle forgot the lock held now")
	}
	// Held again with the value it holds, the job keeps its entry: the
	// handle given out before still reaches it.
	if again := rn.HoldFor("j", "n|2", loser); again != h || rn.Held() != 1 {
		t.Fatalf("held again with its value: a new entry (%v), %d held", again != h, rn.Held())
	}
	stale := &Op{Kind: OpRelease, JobID: "j", LockValue: "n|1", Held: old}
	s.markReleasing([]*Op{stale}, true)
	if h.releasing != 0 {
		t.Fatal("a stale handle marked the lock held now")
	}
	s.settleReleasing([]*Op{stale}, []*Result{{Released: true}})
	if rn.Held() != 1 {
		t.Fatal("a stale handle's applied release forgot the lock held now")
	}

	// The lock is not in Redis: a renewal refuses it. Marked through its
	// handle, the refusal is no loss.
	fenced := &Op{Kind: OpRelease, JobID: "j", LockValue: "n|2", Held: h}
	s.markReleasing([]*Op{fenced}, true)
	if h.releasing != 1 {
		t.Fatalf("releasing %d, want 1", h.releasing)
	}
	s.settleReleasing([]*Op{fenced}, []*Result{{Released: false}})
	if h.releasing != 0 || rn.Held() != 1 {
		t.Fatalf("releasing %d, held %d after a release that did not apply: want 0, 1", h.releasing, rn.Held())
	}
	applied := &Op{Kind: OpRelease, JobID: "j", LockValue: "n|2", Held: h}
	s.markReleasing([]*Op{applied}, true)
	rn.RenewOnce(ctx) // refused while the release is in flight
	select {
	case id := <-lost:
		t.Fatalf("lock %s reported lost while its release was in flight", id)
	default:
	}
	if rn.Held() != 0 || h.live {
		t.Fatalf("held %d, live %v: the refused lock is still registered", rn.Held(), h.live)
	}
	s.settleReleasing([]*Op{applied}, []*Result{{Released: true}})
	rn.ForgetHeld(h)
	if rn.Held() != 0 {
		t.Fatalf("held %d after forgetting a forgotten lock, want 0", rn.Held())
	}

	// A handle that does not stand for the op's job is not used: the op's
	// job is looked up.
	other := rn.HoldFor("other", "n|3", loser)
	mine := rn.HoldFor("mine", "n|4", loser)
	odd := &Op{Kind: OpRelease, JobID: "mine", LockValue: "n|4", Held: other}
	s.markReleasing([]*Op{odd}, true)
	if other.releasing != 0 || mine.releasing != 1 {
		t.Fatalf("releasing other %d, mine %d: want 0, 1", other.releasing, mine.releasing)
	}
	s.settleReleasing([]*Op{odd}, []*Result{{Released: true}})
	if !other.live || mine.live || rn.Held() != 1 {
		t.Fatalf("other live %v, mine live %v, held %d: want true, false, 1", other.live, mine.live, rn.Held())
	}
}

// BenchmarkRenewerJob is a job's lock through the renewer on the hot path
// with live locks registered at once: HoldFor, the intake's Holds, the
// Writer's mark and settle of the write that releases it, and the actor's
// Forget — by look-up (the ops' Held unset, Forget by id: the renewer's
// work per job before the handles) and through the handle.
func BenchmarkRenewerJob(b *testing.B) {
	const names = 1 << 16
	ids := make([]string, names)
	for i := range ids {
		ids[i] = "01JD" + strconv.FormatInt(int64(i)*7919+1e15, 36) + "-job"
	}
	for _, live := range []int{2048, 16384} {
		for _, handle := range []bool{false, true} {
			name := "live=" + strconv.Itoa(live) + "/lookup"
			if handle {
				name = "live=" + strconv.Itoa(live) + "/handle"
			}
			b.Run(name, func(b *testing.B) {
				s := New(nil, Config{LockTTL: 10 * time.Second})
				rn := s.NewLockRenewer(nil)
				loser := lostFunc(func(bool) {})
				held := make([]*HeldLock, names)
				for i := 0; i < live; i++ {
					held[i] = rn.HoldFor(ids[i], "n|1", loser)
				}
				ops := make([]*Op, 1)
				res := []*Result{{Released: true}}
				op := &Op{Kind: OpRelease, LockValue: "n|1"}
				ops[0] = op
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					in, out := (i+live)%names, i%names
					held[in] = rn.HoldFor(ids[in], "n|1", loser)
					if !rn.Holds(ids[out]) {
						b.Fatal("not held")
					}
					op.JobID, op.Held = ids[out], nil
					if handle {
						op.Held = held[out]
					}
					s.markReleasing(ops, true)
					s.settleReleasing(ops, res)
					if handle {
						rn.ForgetHeld(held[out])
					} else {
						rn.Forget(ids[out], "n|1")
					}
				}
			})
		}
	}
}

// renewerStore is a loadedStore and a lock renewer of its own.
func renewerStore(t *testing.T) (*testenv.Env, *Store, *LockRenewer) {
	t.Helper()
	env, s := loadedStore(t)
	return env, s, s.NewLockRenewer(nil)
}

// loadedStore is a store on the test's Redis (10 s lock TTL) with its
// scripts loaded.
func loadedStore(t *testing.T) (*testenv.Env, *Store) {
	t.Helper()
	env := testenv.New(t)
	s := New(env.Client, Config{Prefix: env.KeyPrefix(), LockTTL: 10 * time.Second})
	if err := s.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}
	return env, s
}
