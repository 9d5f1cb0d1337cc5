package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// The job state machine, written out independently of lifecycle.legal: a test
// that fails here means the table changed without this list changing too.
var wantLegal = map[jobstate.State][]jobstate.State{
	jobstate.StatePending:          {"PENDING", "SCHEDULED", "APPROVAL_REQUIRED", "DENIED", "CANCELLED", "FAILED", "TIMEOUT"},
	jobstate.StateApprovalRequired: {"PENDING", "SCHEDULED", "DENIED", "CANCELLED", "TIMEOUT", "FAILED"},
	jobstate.StateScheduled:        {"SCHEDULED", "DISPATCHED", "DENIED", "CANCELLED", "FAILED", "TIMEOUT", "SUCCEEDED", "OUTPUT_QUARANTINED"},
	jobstate.StateDispatched:       {"RUNNING", "SCHEDULED", "SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT", "OUTPUT_QUARANTINED", "DISPATCHED"},
	jobstate.StateRunning:          {"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT", "OUTPUT_QUARANTINED", "SCHEDULED", "RUNNING"},
	jobstate.StateSucceeded:        {"OUTPUT_QUARANTINED"},
}

func wanted(from, to jobstate.State) bool {
	for _, s := range wantLegal[from] {
		if s == to {
			return true
		}
	}
	return false
}

// TestEveryTransition walks all 11×11 pairs. Legal pairs must be allowed by
// the table and applied by Redis's compare-and-set from exactly that state;
// illegal pairs must be refused by the table. Terminal states have no exit
// but the documented SUCCEEDED → OUTPUT_QUARANTINED.
func TestEveryTransition(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	s := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	ctx := context.Background()
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	w := s.NewWriter(2, 64, 256)
	defer w.Close()
	run := func(op *store.Op) *store.Result {
		ch := make(chan *store.Result, 1)
		op.Done = func(r *store.Result) { ch <- r }
		w.Submit(op)
		select {
		case r := <-ch:
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("store op timed out")
		}
		return nil
	}
	legalCount := 0
	for _, from := range jobstate.AllStates {
		for _, to := range jobstate.AllStates {
			if got, want := lifecycle.Legal(from, to), wanted(from, to); got != want {
				t.Errorf("Legal(%s, %s) = %v, want %v", from, to, got, want)
				continue
			}
			if from.Terminal() && lifecycle.Legal(from, to) && !(from == jobstate.StateSucceeded && to == jobstate.StateOutputQuarantined) {
				t.Errorf("terminal %s may leave to %s", from, to)
			}
			if !lifecycle.Legal(from, to) {
				continue
			}
			legalCount++
			id := "tt-" + string(from) + "-" + string(to)
			run(&store.Op{Kind: store.OpActivate, JobID: id, Node: "n", Create: true, Topic: "job.x"})
			// Put the job in `from` directly, then apply the transition
			// through the fenced CAS — once from a wrong state (refused),
			// once from the right one.
			env.Client.HSet(ctx, s.Keys().Job(id), "s", string(from))
			wrong := jobstate.StatePending
			if from == jobstate.StatePending {
				wrong = jobstate.StateRunning
			}
			hop := []jobstate.Hop{{To: to, Reason: "test"}}
			r := run(&store.Op{Kind: store.OpTransition, JobID: id, Node: "n", LockValue: "n|1",
				T: &jobstate.Transition{Expect: jobstate.Expect(wrong), Path: hop}})
			if r.Step != store.StepConflict {
				t.Errorf("%s→%s from the wrong expected state: %v", from, to, r.Step)
			}
			r = run(&store.Op{Kind: store.OpTransition, JobID: id, Node: "n", LockValue: "n|1",
				T: &jobstate.Transition{Expect: jobstate.Expect(from), Path: hop}})
			if r.Step != store.StepOK {
				t.Errorf("%s→%s: %v", from, to, r.Step)
			}
			rec, err := s.GetJob(ctx, id)
			if err != nil || rec.State != to {
				t.Errorf("%s→%s: record %v %v", from, to, rec, err)
			}
		}
	}
	if legalCount != 37 {
		t.Fatalf("%d legal transitions, want 37", legalCount)
	}
}
