package faults_test

// A worker process holding started jobs is killed with SIGKILL: a `troupe
// worker` on its direct subject (issue 20, item 8), and a stock CAP worker
// on a pool subject (issue 15).

import (
	"context"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// waitEvicted polls every node's troupe_workers_evicted_total until each
// counts at least one eviction, and returns when the first and the last
// node did (bounded by within).
func (r *procRig) waitEvicted(within time.Duration) (first, last time.Time, ok bool) {
	seen := make([]time.Time, len(r.nodes))
	deadline := time.Now().Add(within)
	for {
		all := true
		for i := range r.nodes {
			if seen[i].IsZero() && r.metric(i, "troupe_workers_evicted_total") >= 1 {
				seen[i] = time.Now()
			}
			if seen[i].IsZero() {
				all = false
			}
		}
		if all {
			first, last = seen[0], seen[0]
			for _, s := range seen {
				if s.Before(first) {
					first = s
				}
				if s.After(last) {
					last = s
				}
			}
			return first, last, true
		}
		if time.Now().After(deadline) {
			return time.Time{}, time.Time{}, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dispatchedAt is when the record last went to DISPATCHED from another
// state (a DISPATCHED → DISPATCHED hop records a loss, not a dispatch).
func dispatchedAt(rec *store.JobRecord) time.Time {
	var at time.Time
	for _, h := range rec.History {
		if h.To == jobstate.StateDispatched && h.From != jobstate.StateDispatched {
			at = h.At
		}
	}
	return at
}

// A `troupe worker` (direct subject, RUNNING progress on start) is killed
// with SIGKILL while it runs 30 s jobs; the other worker runs its own. The
// nodes evict it 2 s later (it beat every 500 ms); each job it had started
// ends FAILED worker_lost, dead-lettered, WorkerLostGrace (60 s; `troupe
// node` has no flag for it) after the eviction — not at the running
// deadline (300 s) — and none reaches the other worker.
func TestFaultWorkerKilledWithStartedJobs(t *testing.T) {
	procFaultsGate(t)
	const (
		jobs    = 40
		hold    = 30 * time.Second
		running = 300 * time.Second
		grace   = jobactor.WorkerLostGraceDefault
	)
	r := newProcRig(t, procRigOptions{dispatch: 60 * time.Second, running: running})
	began := time.Now()
	for _, id := range []string{"w1", "w2"} {
		r.troupeWorker(id, "--handler", "sleep", "--sleep", hold.String(), "--max-parallel", "100",
			"--heartbeat", "500ms", "--dedupe")
	}
	r.waitWorkers(2)
	// Six beats each, so every node has learned the interval (500 ms; it
	// needs two gaps) and evicts a silent worker 2 s after its last beat,
	// not after the 30 s default. Killed sooner, one node had learned and
	// the other had not (CI, 2026-11-25: evicted by one node 3 s after the
	// kill, by the other not within 30 s).
	time.Sleep(time.Until(began.Add(3 * time.Second)))
	start := time.Now()
	ids := <-r.submitAt("wk", jobs, 200, nil)
	if _, left := r.waitTerminalBy(ids, time.Now().Add(20*time.Second),
		func(_ string, s jobstate.State) bool { return s == jobstate.StateRunning }); len(left) > 0 {
		r.Fatalf("%d of %d jobs not RUNNING 20 s after their submit: %v", len(left), jobs, left)
	}
	held, _ := r.receiptLines("w1")
	if len(held) == 0 {
		t.Fatal("w1 received no job; the test proves nothing")
	}
	r.workers["w1"].kill()
	killed := time.Now()
	firstEvict, lastEvict, ok := r.waitEvicted(30 * time.Second)
	if !ok {
		t.Fatal("the killed worker was not evicted by every node within 30 s")
	}
	at, left := r.waitTerminalBy(ids, lastEvict.Add(grace+30*time.Second),
		func(_ string, s jobstate.State) bool { return s.Terminal() })
	recs := r.records(ids)
	for _, id := range left {
		r.Errorf("%s not terminal %v after the eviction: %s", id, grace+30*time.Second, stateCounts(map[string]*store.JobRecord{id: recs[id]}))
	}
	heldSet := map[string]bool{}
	for _, id := range held {
		heldSet[id] = true
	}
	runs := r.runs("w1", "w2")
	var minAfter, maxAfter time.Duration
	failedLost, runAgain := 0, 0
	for _, id := range ids {
		rec := recs[id]
		if rec == nil {
			r.Errorf("%s: no record", id)
			continue
		}
		for w, n := range runs[id] {
			if n > 1 {
				r.Errorf("%s: %s ran it %d times", id, w, n)
			}
		}
		if !heldSet[id] {
			if rec.State != jobstate.StateSucceeded {
				r.Errorf("%s (w2's): %s (%s): %s", id, rec.State, rec.Reason, hops(rec))
			}
			continue
		}
		if runs[id]["w2"] > 0 {
			runAgain++
			r.Errorf("%s: started on the killed worker, then run by w2: %s", id, hops(rec))
		}
		if rec.State != jobstate.StateFailed || rec.Reason != jobstate.ReasonWorkerLost {
			r.Errorf("%s (the killed worker's): %s (%s), want FAILED worker_lost: %s", id, rec.State, rec.Reason, hops(rec))
			continue
		}
		failedLost++
		after := rec.Updated.Sub(firstEvict)
		if minAfter == 0 || after < minAfter {
			minAfter = after
		}
		maxAfter = max(maxAfter, after)
		// Record times are whole milliseconds, the eviction seen within a
		// 50 ms poll of the metric.
		if after < grace-time.Second || rec.Updated.Sub(lastEvict) > grace+10*time.Second {
			r.Errorf("%s: FAILED worker_lost %v after the first eviction, want about %v: %s", id, after, grace, hops(rec))
		}
		if d := dispatchedAt(rec); !d.IsZero() && rec.Updated.Sub(d) >= running {
			r.Errorf("%s: ended at its running deadline, not by the grace", id)
		}
	}
	dlq, err := r.st.ListDLQ(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	dead := 0
	for _, e := range dlq {
		if e.Reason == jobstate.ReasonWorkerLost && heldSet[e.JobID] {
			dead++
		}
	}
	if dead != len(held) {
		r.Errorf("%d DLQ entries worker_lost for the %d jobs of the killed worker", dead, len(held))
	}
	t.Logf("kill -9 of a troupe worker running %d of %d started jobs (%v each; running deadline %v): evicted %v (first node) to %v (last) "+
		"after the kill; its jobs FAILED worker_lost %v–%v after the first eviction (WorkerLostGrace %v), all %d dead-lettered; "+
		"run again elsewhere %d; all terminal %v after the kill (%v after the first submit): %s",
		len(held), jobs, hold, running, firstEvict.Sub(killed).Round(10*time.Millisecond), lastEvict.Sub(killed).Round(10*time.Millisecond),
		minAfter.Round(10*time.Millisecond), maxAfter.Round(10*time.Millisecond), grace, dead, runAgain,
		at.Sub(killed).Round(10*time.Millisecond), at.Sub(start).Round(10*time.Millisecond), stateCounts(recs))
	if failedLost != len(held) {
		r.Errorf("%d of the killed worker's %d jobs ended FAILED worker_lost", failedLost, len(held))
	}
}

// Two stock CAP workers (testdata/stockworker: pool subject, queue group =
// subject, no progress, no cancels, no dedupe) run 70 s jobs; one is killed
// with SIGKILL. Troupe picks a worker for each job but NATS chooses the
// queue member that runs it, so the runner of a job is unknown: nothing is
// dispatched again and no worker_lost grace applies. The killed worker's
// jobs end TIMEOUT running_timeout at their running deadline (80 s after
// dispatch); the survivor's — including jobs Troupe had picked the killed
// worker for — end SUCCEEDED at 70 s, after the point (eviction + 60 s)
// where a worker_lost grace would have failed them. 0 run twice.
func TestFaultStockWorkerKilledOnAPoolSubject(t *testing.T) {
	procFaultsGate(t)
	const (
		jobs    = 30
		hold    = 70 * time.Second
		running = 80 * time.Second
	)
	r := newProcRig(t, procRigOptions{dispatch: running, running: running})
	began := time.Now()
	for _, id := range []string{"s1", "s2"} {
		r.stockWorker(id, "--sleep", hold.String(), "--max-parallel", "40", "--heartbeat", "1s")
	}
	r.waitWorkers(2)
	// Five beats each, so the nodes have learned the interval (1 s) and
	// evict a silent worker 3.5 s after its last beat, not after 30 s.
	time.Sleep(time.Until(began.Add(5 * time.Second)))
	start := time.Now()
	ids := <-r.submitAt("sk", jobs, 200, nil)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		a, _ := r.receiptLines("s1")
		b, _ := r.receiptLines("s2")
		if len(a)+len(b) >= jobs {
			break
		}
		if time.Now().After(deadline) {
			r.Fatalf("the stock workers received %d of %d jobs in 20 s", len(a)+len(b), jobs)
		}
	}
	victim, survivor := "s1", "s2"
	if a, _ := r.receiptLines("s1"); len(a) == 0 {
		victim, survivor = "s2", "s1"
	}
	held, _ := r.receiptLines(victim)
	// The record names the worker Troupe picked until a result names the
	// one that ran the job.
	picked := map[string]string{}
	for id, rec := range r.records(ids) {
		if rec != nil {
			picked[id] = rec.Worker
		}
	}
	r.workers[victim].kill()
	killed := time.Now()
	firstEvict, _, ok := r.waitEvicted(30 * time.Second)
	if !ok {
		t.Fatal("the killed worker was not evicted by every node within 30 s")
	}
	at, left := r.waitTerminalBy(ids, start.Add(running+45*time.Second),
		func(_ string, s jobstate.State) bool { return s.Terminal() })
	recs := r.records(ids)
	for _, id := range left {
		r.Errorf("%s not terminal %v after the first submit: %s", id, running+45*time.Second, stateCounts(map[string]*store.JobRecord{id: recs[id]}))
	}
	heldSet := map[string]bool{}
	for _, id := range held {
		heldSet[id] = true
	}
	runs := r.runs("s1", "s2")
	pickedVictimRanSurvivor, pickedSurvivorRanVictim := 0, 0
	for _, id := range ids {
		rec := recs[id]
		if rec == nil {
			r.Errorf("%s: no record", id)
			continue
		}
		total := 0
		for _, n := range runs[id] {
			total += n
		}
		if total != 1 {
			r.Errorf("%s: received %d times (%v)", id, total, runs[id])
		}
		if picked[id] == victim && !heldSet[id] {
			pickedVictimRanSurvivor++
		}
		if picked[id] == survivor && heldSet[id] {
			pickedSurvivorRanVictim++
		}
		if !heldSet[id] {
			if rec.State != jobstate.StateSucceeded {
				r.Errorf("%s (run by the survivor, picked %s): %s (%s): %s", id, picked[id], rec.State, rec.Reason, hops(rec))
			}
			continue
		}
		if rec.State != jobstate.StateTimeout || rec.Reason != jobstate.ReasonRunningTimeout {
			r.Errorf("%s (run by the killed worker, picked %s): %s (%s), want TIMEOUT running_timeout: %s",
				id, picked[id], rec.State, rec.Reason, hops(rec))
			continue
		}
		if d := dispatchedAt(rec); !d.IsZero() {
			if after := rec.Updated.Sub(d); after < running-time.Second {
				r.Errorf("%s: TIMEOUT %v after its dispatch, before its running deadline %v", id, after, running)
			}
		}
	}
	t.Logf("kill -9 of 1 of 2 stock CAP workers (pool subject, no progress, no cancels) holding %d of %d jobs of %v "+
		"(running deadline %v): evicted %v after the kill; all terminal %v after the first submit: %s; "+
		"Troupe had picked the killed worker for %d jobs the survivor ran, and the survivor for %d the killed worker ran; "+
		"0 run twice (each job received once)",
		len(held), jobs, hold, running, firstEvict.Sub(killed).Round(10*time.Millisecond), at.Sub(start).Round(10*time.Millisecond),
		stateCounts(recs), pickedVictimRanSurvivor, pickedSurvivorRanVictim)
}
