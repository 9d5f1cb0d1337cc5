package faults_test

// Eviction by evidence (issue 29, items 2–4): a node and a worker killed
// together, a worker paused with free slots, the NATS server paused 90 s.
// Each: no job run twice, none stuck, every job terminal within its bound.

import (
	"syscall"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// endedAt is when the record reached its terminal state (zero: not yet).
func endedAt(rec *store.JobRecord) time.Time {
	if rec == nil || !rec.State.Terminal() || len(rec.History) == 0 {
		return time.Time{}
	}
	return rec.History[len(rec.History)-1].At
}

// runTwice counts the jobs some worker ran twice, or two workers ran, and
// reports each as an error with the job's hops.
func runTwice(t reporter, ids []string, runs map[string]map[string]int, recs map[string]*store.JobRecord) int {
	t.Helper()
	n := 0
	for _, id := range ids {
		twice := len(runs[id]) > 1
		for _, c := range runs[id] {
			twice = twice || c > 1
		}
		if twice {
			n++
			t.Errorf("%s run twice: %v: %s", id, runs[id], hopsOrNone(recs[id]))
		}
	}
	return n
}

// Node n1 and worker w1 are killed with SIGKILL together while both
// workers run 30 s jobs (running deadline 9,000 s). n2 evicts w1 about 2 s
// later; n1's jobs are adopted by n2 once their lease runs out (2 lock
// TTLs). n1's jobs that were on w1 are that worker's loss as of its
// eviction: they end FAILED worker_lost WorkerLostGrace (60 s) after the
// eviction — like n2's own jobs on w1 — not at the running deadline, and
// none is run again anywhere. Everything else SUCCEEDED.
func TestFaultNodeAndWorkerKilledTogether(t *testing.T) {
	procFaultsGate(t)
	const (
		jobs      = 150
		rate      = 10
		killAfter = 100
		hold      = 30 * time.Second
		lockTTL   = 10 * time.Second
		grace     = jobactor.WorkerLostGraceDefault
	)
	r := newProcRig(t, procRigOptions{lock: lockTTL, dispatch: 60 * time.Second, running: 9000 * time.Second})
	for _, id := range []string{"w1", "w2"} {
		r.troupeWorker(id, "--handler", "sleep", "--sleep", hold.String(), "--max-parallel", "200",
			"--heartbeat", "500ms", "--dedupe")
	}
	r.waitWorkers(2)
	// The submitter pauses after killAfter jobs until the kill is done and
	// the jobs' states read: what each job was at the kill is then exact.
	// Without the pause, a job n1 dispatched to w1 in the last milliseconds
	// could be received by w1 (its receipt written) while its start died
	// with n1 unwritten: the adopter rightly places it again on w2 (nothing
	// says it started: stock workers send no progress, and a progress is
	// acted on only by the job's owner), and the run-twice count could not
	// tell that from a defect (stop 37's CI and 1 run in 10 here failed so,
	// each on a job submitted within 0.1 s of the kill).
	reached, resume := make(chan struct{}), make(chan struct{})
	done := r.submitAt("nw", jobs, rate, func(i int) {
		if i == killAfter-1 {
			close(reached)
			<-resume
		}
	})
	<-reached
	// Kill only once every job submitted so far is RUNNING (a worker said it
	// started it, and its owner wrote so): a job still between its
	// dispatch and that write could be running on w1 while its record says
	// DISPATCHED, and what it should become could not be told from its
	// record. (A fixed second's wait here failed once in CI, stop 40.)
	sofar := r.allIDs("nw", killAfter)
	if _, left := r.waitTerminalBy(sofar, time.Now().Add(30*time.Second), func(_ string, s jobstate.State) bool {
		return s == jobstate.StateRunning || s.Terminal()
	}); len(left) > 0 {
		recs := r.records(left)
		for _, id := range left {
			r.Errorf("%s not RUNNING 30 s after its submit: %s", id, hopsOrNone(recs[id]))
		}
		t.FailNow()
	}
	n1, w1 := r.nodes[0], r.workers["w1"]
	_ = n1.cmd.Process.Kill()
	_ = w1.cmd.Process.Kill()
	killed := time.Now()
	n1.kill()
	w1.kill()
	// What each job was at the kill: n1's and n2's jobs running on w1.
	adopted, own := map[string]bool{}, map[string]bool{}
	for id, rec := range r.records(r.allIDs("nw", jobs)) { // nil: not submitted yet
		if rec == nil || rec.State != jobstate.StateRunning || rec.Worker != "w1" {
			continue // a job not yet started there is placed again elsewhere
		}
		if rec.Node == "n1" {
			adopted[id] = true
		} else {
			own[id] = true
		}
	}
	close(resume)
	var evicted time.Duration
	for r.metric(1, "troupe_workers_evicted_total") < 1 {
		if time.Since(killed) > 30*time.Second {
			t.Fatal("n2 never evicted w1")
		}
		time.Sleep(50 * time.Millisecond)
	}
	evicted = time.Since(killed)
	ids := <-done
	bound := killed.Add(evicted + grace + 20*time.Second)
	at, recs := r.allTerminalBy(r, ids, bound.Add(hold), killed, "the kill")
	var lostAdopted, lostOwn int
	var latestAdopted, latestOwn time.Duration
	for _, id := range ids {
		rec := recs[id]
		if rec == nil || !rec.State.Terminal() {
			continue
		}
		switch {
		case adopted[id] || own[id]:
			if rec.State != jobstate.StateFailed || rec.Reason != jobstate.ReasonWorkerLost {
				r.Errorf("%s (on w1 at the kill): %s %s, want FAILED worker_lost: %s", id, rec.State, rec.Reason, hops(rec))
				continue
			}
			d := endedAt(rec).Sub(killed)
			if adopted[id] {
				lostAdopted++
				latestAdopted = max(latestAdopted, d)
			} else {
				lostOwn++
				latestOwn = max(latestOwn, d)
			}
			if endedAt(rec).After(bound) {
				r.Errorf("%s ended %v after the kill, past the eviction + grace (%v + %v)", id, d.Round(time.Second), evicted, grace)
			}
		case rec.State != jobstate.StateSucceeded:
			r.Errorf("%s: %s (%s): %s", id, rec.State, rec.Reason, hops(rec))
		}
	}
	twice := runTwice(r, ids, r.runs("w1", "w2"), recs)
	t.Logf("n1 and w1 killed together under %d jobs of %v at %d/s (lock TTL %v, running deadline 9000 s): w1 evicted %v after the kill; "+
		"on w1 at the kill: %d of n1's jobs (adopted by n2), %d of n2's; FAILED worker_lost: %d adopted, the last %v after the kill, "+
		"%d own, the last %v after; run twice %d; all terminal %v after the kill: %s",
		jobs, hold, rate, lockTTL, evicted.Round(10*time.Millisecond), len(adopted), len(own), lostAdopted,
		latestAdopted.Round(10*time.Millisecond), lostOwn, latestOwn.Round(10*time.Millisecond), twice,
		at.Sub(killed).Round(10*time.Millisecond), stateCounts(recs))
	if len(adopted) == 0 {
		r.Errorf("n1 held no job on w1 at the kill; the test proved nothing")
	}
}

// A `troupe worker` with free slots (max_parallel 20, 1 s jobs) is stopped
// with SIGSTOP for 40 s while 400 jobs arrive at 20/s on two nodes, then
// resumed. The nodes evict it and place elsewhere what it had not started;
// dispatches that reached its socket meanwhile carry the heartbeat the node
// had last heard from it, and it drops them on resuming (its silence since
// was long enough to be evicted for): no job runs twice, every job ends.
func TestFaultWorkerPausedWithFreeSlots(t *testing.T) {
	procFaultsGate(t)
	const (
		jobs       = 400
		rate       = 20
		pauseAfter = 100
		pause      = 40 * time.Second
		hold       = time.Second
	)
	r := newProcRig(t, procRigOptions{dispatch: 60 * time.Second, running: 90 * time.Second})
	r.troupeWorker("w1", "--handler", "sleep", "--sleep", hold.String(), "--max-parallel", "20",
		"--heartbeat", "500ms", "--dedupe")
	r.troupeWorker("w2", "--handler", "sleep", "--sleep", hold.String(), "--max-parallel", "40",
		"--heartbeat", "500ms", "--dedupe")
	r.waitWorkers(2)
	reached := make(chan struct{})
	done := r.submitAt("wf", jobs, rate, func(i int) {
		if i == pauseAfter-1 {
			close(reached)
		}
	})
	<-reached
	w1 := r.workers["w1"]
	if err := w1.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	first, _, ok := r.waitEvicted(pause - time.Second)
	if !ok {
		r.Fatalf("the stopped worker was not evicted by both nodes within %v", pause)
	}
	time.Sleep(time.Until(stopped.Add(pause)))
	if err := w1.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	ids := <-done
	const bound = 60 * time.Second
	at, recs := r.allTerminalBy(r, ids, resumed.Add(bound), resumed, "the worker resumed")
	redisp := 0
	for _, id := range ids {
		rec := recs[id]
		if rec == nil || !rec.State.Terminal() {
			continue
		}
		if rec.State != jobstate.StateSucceeded {
			r.Errorf("%s: %s (%s): %s", id, rec.State, rec.Reason, hops(rec))
		}
		if redispatched(rec) {
			redisp++
		}
	}
	twice := runTwice(r, ids, r.runs("w1", "w2"), recs)
	// Give the resumed worker's log a moment (its writes follow SIGCONT).
	time.Sleep(200 * time.Millisecond)
	dropped := logCount(w1, "silence its node could have evicted it for")
	t.Logf("w1 (max_parallel 20) stopped %v under %d jobs of %v at %d/s, 2 nodes: evicted %v after SIGSTOP; %d jobs dispatched again "+
		"after the eviction; stale dispatches w1 dropped on resuming: %d; run twice: %d; all terminal %v after SIGCONT: %s",
		pause, jobs, hold, rate, first.Sub(stopped).Round(10*time.Millisecond), redisp, dropped, twice,
		at.Sub(resumed).Round(10*time.Millisecond), stateCounts(recs))
	if redisp == 0 {
		t.Error("no job was dispatched again; the test proved nothing")
	}
}

// The NATS server is stopped with SIGSTOP for 90 s while 300 jobs of 2 s
// arrive at 20/s on two nodes and two workers (liveness window 2 s), then
// resumed. Every worker falls silent at once, so no node evicts any (the
// silence is the server's); the nodes' connections, pinging every 2 s,
// drop within seconds and reconnect after SIGCONT. No job that ran ends
// FAILED worker_lost, none runs twice, all SUCCEEDED within 120 s of the
// resume.
func TestFaultNATSPaused90s(t *testing.T) {
	procFaultsGate(t)
	const (
		jobs       = 300
		rate       = 20
		pauseAfter = 100
		pause      = 90 * time.Second
		hold       = 2 * time.Second
		bound      = 120 * time.Second
	)
	r := newProcRig(t, procRigOptions{dispatch: 300 * time.Second, running: 300 * time.Second})
	for _, id := range []string{"w1", "w2"} {
		r.troupeWorker(id, "--handler", "sleep", "--sleep", hold.String(), "--max-parallel", "64",
			"--heartbeat", "500ms", "--dedupe", "--reconnect-wait", "250ms")
	}
	r.waitWorkers(2)
	reached := make(chan struct{})
	done := r.submitAt("np90", jobs, rate, func(i int) {
		if i == pauseAfter-1 {
			close(reached)
		}
	})
	<-reached
	if err := r.nats.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	time.Sleep(pause)
	if err := r.nats.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	ids := <-done
	at, recs := r.allTerminalBy(r, ids, resumed.Add(bound), resumed, "the server resumed")
	lostHops := 0
	for _, id := range ids {
		rec := recs[id]
		if rec == nil || !rec.State.Terminal() {
			continue
		}
		if rec.State != jobstate.StateSucceeded {
			r.Errorf("%s: %s (%s): %s", id, rec.State, rec.Reason, hops(rec))
		}
		for _, h := range rec.History {
			if h.Reason == jobstate.ReasonWorkerLost {
				lostHops++
				break
			}
		}
	}
	twice := runTwice(r, ids, r.runs("w1", "w2"), recs)
	evictions := r.metric(-1, "troupe_workers_evicted_total")
	var linkHeld, hushed int
	for _, n := range r.nodes {
		linkHeld += logCount(n, "NATS connection down or re-established")
		hushed += logCount(n, "every worker went silent at once")
	}
	var stale int
	for _, w := range r.workers {
		stale += logCount(w, "silence its node could have evicted it for")
	}
	t.Logf("nats-server stopped %v under %d jobs of %v at %d/s, 2 nodes, 2 workers (window 2 s): evictions %.0f; sweeps held by the link rule %d, "+
		"hushes (every worker silent) %d; jobs with a worker_lost hop %d; stale dispatches dropped %d; run twice %d; "+
		"all terminal %v after SIGCONT (%v after SIGSTOP): %s",
		pause, jobs, hold, rate, evictions, linkHeld, hushed, lostHops, stale, twice,
		at.Sub(resumed).Round(10*time.Millisecond), at.Sub(stopped).Round(10*time.Millisecond), stateCounts(recs))
	if evictions != 0 {
		r.Errorf("%.0f evictions while the server, not the workers, was stopped", evictions)
	}
	if linkHeld == 0 && hushed == 0 {
		t.Error("neither the link rule nor the hush held evictions: the stall went unnoticed")
	}
}
