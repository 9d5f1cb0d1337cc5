package faults_test

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// TestFaultNodeKilledResultsWaitForItsLocks: a node killed with kill -9
// leaves its jobs' locks in Redis until their TTL runs out (45 s here,
// renewed every 15 s). The worker's results for those jobs reach the other
// node meanwhile; forwarding them to the dead owner fails, and they must
// wait for the locks to lapse and then end their jobs — not be offered
// again a second apart until JetStream's 20 deliveries are spent and they
// are dead-lettered (max_deliveries), leaving the jobs to time out.
func TestFaultNodeKilledResultsWaitForItsLocks(t *testing.T) {
	procFaultsGate(t)
	const (
		jobs = 40
		lock = 45 * time.Second
	)
	r := newProcRig(t, procRigOptions{lock: lock, dispatch: 150 * time.Second, running: 150 * time.Second, logLevel: "warn"})
	r.stockWorker("s1", "--sleep", "3s", "--max-parallel", "100", "--heartbeat", "1s")
	r.waitWorkers(1)
	ids := <-r.submitAt("fd", jobs, 500, nil)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got, _ := r.receiptLines("s1"); len(got) >= jobs {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker never received every job")
		}
	}
	owned := 0
	for _, rec := range r.records(ids) {
		if rec != nil && len(rec.History) > 0 && rec.History[0].Node == "n1" {
			owned++
		}
	}
	r.nodes[0].kill()
	killed := time.Now()
	at, left := r.waitTerminalBy(ids, killed.Add(2*lock+20*time.Second),
		func(_ string, s jobstate.State) bool { return s.Terminal() })
	recs := r.records(ids)
	succeeded := 0
	for _, rec := range recs {
		if rec != nil && rec.State == jobstate.StateSucceeded {
			succeeded++
		}
	}
	returned := r.metric(1, "troupe_events_forwarded_total")
	t.Logf("%d jobs, %d created by the killed node; %d SUCCEEDED, all terminal %v after the kill (lock TTL %v); %d not terminal; "+
		"forwards by the survivor (taken or handed back): %v",
		jobs, owned, succeeded, at.Sub(killed).Round(time.Millisecond), lock, len(left), returned)
	if owned == 0 {
		t.Fatal("the killed node owned no job: nothing was tested")
	}
	if succeeded != jobs {
		bad := map[string]*store.JobRecord{}
		for id, rec := range recs {
			if rec == nil || rec.State != jobstate.StateSucceeded {
				bad[id] = rec
			}
		}
		r.Fatalf("%d of %d jobs SUCCEEDED; the others: %s", succeeded, jobs, stateCounts(bad))
	}
}
