package store

import (
	"context"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/testenv"
)

// A renewal that finds a lock gone while a write giving that lock up is in
// flight drops the lock without a loss report: the write's own reply tells
// the job. Without such a write, the same refusal is a loss.
func TestRenewalRefusedDuringItsOwnReleaseIsNoLoss(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	s := New(env.Client, Config{Prefix: env.KeyPrefix(), LockTTL: 10 * time.Second})
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	rn := s.NewLockRenewer(nil)
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
