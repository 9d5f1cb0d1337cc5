package faults_test

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// TestFaultNodeKilledWithUnwrittenWaits: jobs waiting for room within their
// capacity grace have no record — only their un-acked submit in JetStream.
// A node killed with kill -9 while it holds such waits loses none of them:
// JetStream offers their submits to the other node, which places them as
// slots free. Every job succeeds, and the stock worker (max_parallel 2,
// 100 ms jobs: 20 a second) receives each exactly once.
func TestFaultNodeKilledWithUnwrittenWaits(t *testing.T) {
	procFaultsGate(t)
	const jobs = 300
	r := newProcRig(t, procRigOptions{dispatch: 60 * time.Second, running: 60 * time.Second, logLevel: "warn"})
	r.stockWorker("s1", "--sleep", "100ms", "--max-parallel", "2", "--heartbeat", "1s")
	r.waitWorkers(1)
	start := time.Now()
	ids := <-r.submitAt("uw", jobs, 2000, nil)
	// Wait until the victim holds unwritten waits (both nodes pull submits).
	var held float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if held = r.metric(0, "troupe_capacity_waits_unwritten"); held >= 20 {
			break
		}
		if time.Now().After(deadline) {
			r.Fatalf("node n1 never held 20 unwritten waits (%v)", held)
		}
	}
	other := r.metric(1, "troupe_capacity_waits_unwritten")
	r.nodes[0].kill()
	killed := time.Now()
	at, left := r.waitTerminalBy(ids, killed.Add(90*time.Second),
		func(_ string, s jobstate.State) bool { return s == jobstate.StateSucceeded })
	recs := r.records(ids)
	for _, id := range left {
		r.Errorf("%s not SUCCEEDED 90 s after the kill: %s", id, hopsOrNone(recs[id]))
	}
	runs := r.runs("s1")
	twice, never := 0, 0
	for _, id := range ids {
		switch n := runs[id]["s1"]; {
		case n == 0:
			never++
		case n > 1:
			twice++
		}
	}
	written := r.metric(1, "troupe_capacity_waits_total")
	t.Logf("%d jobs; n1 held %v unwritten waits (n2 %v) when killed %v after the first submit; all SUCCEEDED %v after the kill; "+
		"capacity waits written by n2: %v; received twice %d, never %d",
		jobs, held, other, killed.Sub(start).Round(time.Millisecond), at.Sub(killed).Round(time.Millisecond), written, twice, never)
	if twice != 0 || never != 0 {
		r.Fatalf("%d jobs received twice, %d never", twice, never)
	}
}
