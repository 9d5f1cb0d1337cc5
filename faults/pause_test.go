package faults_test

// A worker process, then a node process, stopped with SIGSTOP for longer
// than a worker's liveness window and resumed with SIGCONT, under a steady
// stream of jobs (issue 20, item 8).

import (
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// A `troupe worker` stopped with SIGSTOP past its liveness window (2 s: it
// beats every 500 ms), then resumed, while 300 jobs arrive at 15/s on two
// nodes. The nodes evict it. The jobs they had dispatched to it with no
// sign of arrival go to the other worker; the jobs it had started stay its
// own and end with its results when it resumes (their worker_lost grace,
// 60 s, outlasts the pause). A result it sends for a job dispatched again
// meanwhile, while that job is still open, ends the job
// (result_of=earlier_dispatch) and the later dispatch is cancelled. No
// started job is dispatched again, no job times out, every job ends.
//
// "40s_pause": both workers run 2 s jobs and the worker stops for 40 s: the
// jobs dispatched again finish on the other worker long before it resumes.
// "slower_other_worker": it stops for 10 s and the other worker takes 15 s
// a job, so its own results come first and end the jobs dispatched again.
func TestFaultWorkerPausedPastItsTTL(t *testing.T) {
	procFaultsGate(t)
	t.Run("40s_pause", func(t *testing.T) { workerPause(t, 40*time.Second, 2*time.Second) })
	t.Run("slower_other_worker", func(t *testing.T) { workerPause(t, 10*time.Second, 15*time.Second) })
}

// workerPause stops w1 (2 s jobs) for pause while w2 takes otherHold a job.
func workerPause(t *testing.T, pause, otherHold time.Duration) {
	const (
		jobs       = 300
		rate       = 15
		pauseAfter = 75 // jobs submitted when the worker stops
		hold       = 2 * time.Second
	)
	r := newProcRig(t, procRigOptions{dispatch: 60 * time.Second, running: 90 * time.Second})
	r.troupeWorker("w1", "--handler", "sleep", "--sleep", hold.String(), "--max-parallel", "500",
		"--heartbeat", "500ms", "--dedupe")
	r.troupeWorker("w2", "--handler", "sleep", "--sleep", otherHold.String(), "--max-parallel", "500",
		"--heartbeat", "500ms", "--dedupe")
	r.waitWorkers(2)
	cancels := r.watchCancels()
	reached := make(chan struct{})
	start := time.Now()
	done := r.submitAt("wp", jobs, rate, func(i int) {
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
	// A stopped process writes nothing: its receipts so far are what it
	// received before the pause.
	time.Sleep(100 * time.Millisecond)
	beforePause, _ := r.receiptLines("w1")
	// Both nodes evict it (each router keeps its own registry).
	var evicted time.Duration
	for {
		if r.metric(0, "troupe_workers_evicted_total") >= 1 && r.metric(1, "troupe_workers_evicted_total") >= 1 {
			evicted = time.Since(stopped)
			break
		}
		if time.Since(stopped) > pause-time.Second {
			t.Fatalf("the stopped worker was not evicted by both nodes within %v", pause)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Until(stopped.Add(pause)))
	if err := w1.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	ids := <-done
	at, recs := r.allTerminalBy(t, ids, resumed.Add(60*time.Second), resumed, "the worker resumed")

	w1IDs, w1Dups := r.receiptLines("w1")
	_, w2Dups := r.receiptLines("w2")
	before := map[string]bool{}
	for _, id := range beforePause {
		before[id] = true
	}
	runs := r.runs("w1", "w2")
	var (
		sameWorker, both, bothAfterResume, bothUnreported, startedAgain int
		redisp, keptForW1, earlier, earlierActive, earlierQueued        int
		cancelled, bothAfterCancel                                      int
	)
	for _, id := range ids {
		rec := recs[id]
		if rec == nil {
			continue
		}
		switch rec.State {
		case jobstate.StateSucceeded:
		case jobstate.StateTimeout:
			t.Errorf("%s: TIMEOUT (%s) although no job outlived its deadline: %s", id, rec.Reason, hops(rec))
		default:
			t.Errorf("%s: %s (%s): %s", id, rec.State, rec.Reason, hops(rec))
		}
		for w, n := range runs[id] {
			if n > 1 {
				sameWorker++
				t.Errorf("%s: %s ran it %d times", id, w, n)
			}
		}
		if redispatched(rec) {
			redisp++
		}
		if startedThenRedispatched(rec) {
			startedAgain++
			t.Errorf("%s: recorded RUNNING, then dispatched again: %s", id, hops(rec))
		}
		for _, h := range rec.History {
			if h.From == jobstate.StateRunning && h.To == jobstate.StateRunning && h.Reason == jobstate.ReasonWorkerLost {
				keptForW1++
				if rec.State != jobstate.StateSucceeded || rec.Worker != "w1" {
					t.Errorf("%s: started on the paused worker, ended %s by %q: %s", id, rec.State, rec.Worker, hops(rec))
				}
				break
			}
		}
		if rec.Fields["result_of"] == "earlier_dispatch" {
			earlier++
			if rec.Worker != "w1" || !strings.Contains(rec.Fields["lost_workers"], "w1") {
				t.Errorf("%s: result_of=earlier_dispatch from %q, lost_workers %q", id, rec.Worker, rec.Fields["lost_workers"])
			}
			// The hop into the terminal state says where the later
			// dispatch was: with its worker (cancelled) or still queued.
			last := rec.History[len(rec.History)-1]
			if last.From == jobstate.StateDispatched || last.From == jobstate.StateRunning {
				earlierActive++
				if slices.Contains(cancels.reasons(id), "result_of_earlier_dispatch") {
					cancelled++
				} else {
					t.Errorf("%s: ended by an earlier dispatch's result while dispatched again, but no cancel was published: %s", id, hops(rec))
				}
				if runs[id]["w2"] > 0 {
					bothAfterCancel++ // w2 had it too (it stops on the cancel)
				}
			} else {
				earlierQueued++
			}
		}
		if runs[id]["w1"] > 0 && runs[id]["w2"] > 0 {
			both++
			switch {
			case !before[id]:
				bothAfterResume++ // delivered to w1 from its socket after SIGCONT
			case !startedThenRedispatched(rec):
				bothUnreported++ // w1 had it, the nodes never heard it start
			}
		}
	}
	t.Logf("worker paused %v (liveness 2 s) under %d jobs at %d/s (%v a job on it, %v on the other), 2 nodes: evicted by both nodes %v after SIGSTOP; "+
		"all terminal %v after SIGCONT (%v after the first submit): %s",
		pause, jobs, rate, hold, otherHold, evicted.Round(10*time.Millisecond), at.Sub(resumed).Round(10*time.Millisecond),
		at.Sub(start).Round(10*time.Millisecond), stateCounts(recs))
	t.Logf("the paused worker had received %d jobs at SIGSTOP (%d in all); %d jobs it had started were kept for it (worker_lost grace) "+
		"and ended by its results; %d jobs dispatched again after the eviction; %d recorded RUNNING then dispatched again",
		len(beforePause), len(w1IDs), keptForW1, redisp, startedAgain)
	t.Logf("result_of=earlier_dispatch: %d (%d while the later dispatch was with w2: %d cancels published, %d of those w2 had "+
		"received — troupe worker stops a job on its cancel; %d while still waiting to be placed)",
		earlier, earlierActive, cancelled, bothAfterCancel, earlierQueued)
	t.Logf("run by both workers: %d (%d delivered to the paused worker from its socket after SIGCONT, after the nodes had dispatched "+
		"them to w2; %d it had received before SIGSTOP without the nodes hearing it start); run twice by one worker: %d; "+
		"repeated deliveries deduped: w1 %d, w2 %d; dispatches resent: %.0f",
		both, bothAfterResume, bothUnreported, sameWorker, w1Dups, w2Dups, r.metric(-1, "troupe_dispatch_resent_total"))
	if n := both - bothUnreported; n != 0 {
		t.Errorf("%d jobs ran on both workers although the nodes knew the paused worker had started them, or had placed them elsewhere "+
			"(%d delivered from its socket after SIGCONT)", n, bothAfterResume)
	}
	if otherHold > pause+2*hold {
		// The other worker is still running every job dispatched again
		// when the stopped worker's results come: each must end by those.
		if redisp == 0 {
			t.Error("no job was dispatched again; the scenario proved nothing")
		}
		// Except those it never ran: dispatches that reached its socket
		// while it was stopped, which it drops on resuming (stale).
		never := 0
		for _, id := range ids {
			if rec := recs[id]; rec != nil && redispatched(rec) && runs[id]["w1"] == 0 {
				never++
			}
		}
		if earlier != redisp-never {
			t.Errorf("%d of %d jobs dispatched again (%d never run by the stopped worker) ended by its earlier result",
				earlier, redisp, never)
		}
	}
}

// A `troupe node` stopped for 10 s — five times its workers' liveness
// window (2 s), half its lock TTL (20 s) — while 300 jobs of 2 s arrive at
// 15/s on two nodes and two workers. On SIGCONT its router sees the gap,
// evicts nobody and forgets no replica; its jobs' results, handed back to
// JetStream by the other node while it was stopped, reach it when it runs
// again. Every job SUCCEEDED, each on one worker, none dispatched again.
func TestFaultNodePausedPastTheWorkerTTL(t *testing.T) {
	procFaultsGate(t)
	const (
		jobs       = 300
		rate       = 15
		pauseAfter = 75
		pause      = 10 * time.Second
		lockTTL    = 20 * time.Second
		hold       = 2 * time.Second
	)
	r := newProcRig(t, procRigOptions{lock: lockTTL, dispatch: 60 * time.Second, running: 60 * time.Second})
	for _, id := range []string{"w1", "w2"} {
		r.troupeWorker(id, "--handler", "sleep", "--sleep", hold.String(), "--max-parallel", "64",
			"--heartbeat", "500ms", "--dedupe")
	}
	r.waitWorkers(2)
	reached := make(chan struct{})
	start := time.Now()
	done := r.submitAt("np", jobs, rate, func(i int) {
		if i == pauseAfter-1 {
			close(reached)
		}
	})
	<-reached
	n1 := r.nodes[0]
	if err := n1.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var heldByN1 int
	for _, id := range r.allIDs("np", pauseAfter) {
		if rec, err := r.st.GetJob(t.Context(), id); err == nil && rec.Node == "n1" && !rec.State.Terminal() {
			heldByN1++
		}
	}
	time.Sleep(time.Until(stopped.Add(pause)))
	if err := n1.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	ids := <-done
	at, recs := r.allTerminalBy(r, ids, resumed.Add(90*time.Second), resumed, "the node resumed")
	runs := r.runs("w1", "w2")
	twice, both, workerLost := 0, 0, 0
	for _, id := range ids {
		rec := recs[id]
		if rec != nil && rec.State != jobstate.StateSucceeded && rec.State.Terminal() {
			r.Errorf("%s: %s (%s): %s", id, rec.State, rec.Reason, hops(rec))
		}
		if rec != nil {
			for _, h := range rec.History {
				if h.Reason == jobstate.ReasonWorkerLost {
					workerLost++
					r.Errorf("%s: a worker_lost hop although no worker stopped: %s", id, hops(rec))
					break
				}
			}
		}
		for w, n := range runs[id] {
			if n > 1 {
				twice++
				r.Errorf("%s: %s ran it %d times", id, w, n)
			}
		}
		if len(runs[id]) > 1 {
			both++
			r.Errorf("%s: ran on both workers", id)
		}
	}
	evicted := r.metric(-1, "troupe_workers_evicted_total")
	guard := logCount(n1, "router resumed after a pause")
	_, d1 := r.receiptLines("w1")
	_, d2 := r.receiptLines("w2")
	t.Logf("node n1 of 2 stopped %v (workers' liveness 2 s, lock TTL %v) under %d jobs of %v at %d/s; it held %d jobs in flight; "+
		"all terminal %v after SIGCONT (%v after the first submit): %s",
		pause, lockTTL, jobs, hold, rate, heldByN1, at.Sub(resumed).Round(10*time.Millisecond),
		at.Sub(start).Round(10*time.Millisecond), stateCounts(recs))
	t.Logf("workers evicted (both nodes): %.0f; n1's pause guard fired %d times; worker_lost hops %d; run twice by one worker %d, "+
		"by both workers %d; repeated deliveries deduped %d; dispatches resent %.0f; events forwarded between nodes %.0f",
		evicted, guard, workerLost, twice, both, d1+d2, r.metric(-1, "troupe_dispatch_resent_total"),
		r.metric(-1, "troupe_events_forwarded_total"))
	if evicted != 0 {
		r.Errorf("%.0f workers evicted although none stopped", evicted)
	}
	if guard == 0 {
		t.Error("n1 never logged its router's pause guard: the pause went unnoticed")
	}
	if heldByN1 == 0 {
		t.Error("the stopped node held no job in flight; the test proved nothing")
	}
}

// allIDs is prefix-0 … prefix-(n-1).
func (r *procRig) allIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = prefix + "-" + strconv.Itoa(i)
	}
	return ids
}
