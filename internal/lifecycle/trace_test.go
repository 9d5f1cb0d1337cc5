package lifecycle

import (
	"fmt"
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// happyPath takes a fresh job to SUCCEEDED through DISPATCHED and RUNNING
// and returns every effect the core emitted, in order.
func (d *driver) happyPath() []Effect {
	var all []Effect
	feed := func(ev any) { all = append(all, d.feed(ev)...) }
	feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}, TraceID: "t-1"})
	feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateCreated, State: jobstate.StateDispatched, Fence: 1}})
	feed(&Progress{P: &capv1.JobProgress{JobId: "job-1"}, From: "w1"})
	feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	feed(&Result{Res: &capv1.JobResult{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, WorkerId: "w1"}})
	feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	if d.j.State != jobstate.StateSucceeded {
		d.t.Fatalf("happy path ended %s", d.j.State)
	}
	return all
}

// With Config.Trace the core reports every durable state change, in order,
// with the hops it took, and before the dispatch that depends on it; the
// shell's spans follow these alone.
func TestTraceReportsEveryDurableStateChangeBeforeItsEffects(t *testing.T) {
	d := newDriver(t)
	d.j.cfg.Trace = true
	fx := d.happyPath()
	var got []string
	published := false
	for _, e := range fx {
		switch e := e.(type) {
		case Moved:
			s := fmt.Sprintf("from=%q created=%v", e.From, e.Created)
			for _, h := range e.Path {
				s += fmt.Sprintf(" %s/%s", h.To, h.Reason)
			}
			got = append(got, s)
		case *PublishRequest:
			if len(got) == 0 {
				t.Fatal("request published before the move to DISPATCHED was reported")
			}
			published = true
		case Resumed:
			t.Fatalf("fresh job reported as resumed: %v", e)
		}
	}
	want := []string{
		`from="" created=true SCHEDULED/policy_allowed DISPATCHED/dispatched`,
		`from="DISPATCHED" created=false RUNNING/worker_started`,
		`from="RUNNING" created=false SUCCEEDED/worker_completed`,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || !published {
		t.Fatalf("moves %q (published %v), want %q", got, published, want)
	}
}

// An activation that finds the job's record (a parked job woken by its
// result) reports the state it found, once.
func TestTraceReportsAResumedJobsState(t *testing.T) {
	d := newDriver(t)
	d.j.cfg.Trace = true
	d.feed(&Result{Res: &capv1.JobResult{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, WorkerId: "w1"}})
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateAdopted, State: jobstate.StateRunning,
		Fence: 2, Holder: "n1|1|p", Fields: map[string]string{"reason": string(jobstate.ReasonStarted), "worker": "w1"}}})
	r, ok := find[Resumed](fx)
	if !ok || r.State != jobstate.StateRunning || r.Reason != jobstate.ReasonStarted {
		t.Fatalf("activation of a parked job: %v, want Resumed RUNNING/started", fx)
	}
	if _, ok := find[Moved](fx); ok {
		t.Fatalf("activation alone reported a move: %v", fx)
	}
}

// Without Config.Trace the core emits no tracing effect at all: tracing
// off builds nothing in the core.
func TestTraceOffEmitsNoTracingEffects(t *testing.T) {
	d := newDriver(t)
	for _, e := range d.happyPath() {
		switch e.(type) {
		case Moved, Resumed:
			t.Fatalf("tracing off, yet the core emitted %T", e)
		}
	}
}

// The allocations of a whole job's life in the core, tracing off and on:
// off pays nothing for tracing (each report is behind one flag test); on
// pays for the reports. The numbers are logged (go test -v -run
// TestTraceCoreAllocations).
func TestTraceCoreAllocations(t *testing.T) {
	run := func(trace bool) float64 {
		return testing.AllocsPerRun(200, func() {
			d := newDriver(t)
			d.j.cfg.Trace = trace
			d.happyPath()
		})
	}
	off, on := run(false), run(true)
	t.Logf("allocations per job life in the core: tracing off %.0f, on %.0f", off, on)
	if on <= off {
		t.Fatalf("tracing on allocates %.0f, off %.0f: the measurement does not see the reports", on, off)
	}
}
