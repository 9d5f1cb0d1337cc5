package troupe_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// sagaWorld is one saga test's node, worker and what the worker saw.
type sagaWorld struct {
	*fixture
	// comps are the compensation jobs the worker received, in order.
	mu    sync.Mutex
	comps []*capv1.JobRequest
	// compIn signals each compensation receipt (job id).
	compIn chan string
	// hold, when set, is called (on the worker's goroutine) for each
	// compensation before it is answered.
	hold func(req *capv1.JobRequest)
}

// newSagaWorld starts a node and one worker that succeeds every step but
// the one with failAt as its step index (FAILED_FATAL), and answers every
// compensation SUCCEEDED.
func newSagaWorld(t *testing.T, failAt int32) *sagaWorld {
	// The node runs no rollbacks itself: each test starts the runners it
	// means to (with its own policy), as other replicas would.
	w := &sagaWorld{fixture: newFixture(t, func(c *troupe.Config) { c.Tuning.NoSagas = true }), compIn: make(chan string, 64)}
	w.startWorker("w1", true, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		if req.Labels[saga.LabelIsCompensation] == "true" {
			w.mu.Lock()
			w.comps = append(w.comps, req)
			hold := w.hold
			w.mu.Unlock()
			w.compIn <- req.JobId
			if hold != nil {
				hold(req)
			}
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
		}
		if req.StepIndex == failAt {
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED_FATAL, ErrorCode: "boom"}
		}
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
	})
	return w
}

// startSagas starts a saga runner next to the node, as a replica would: its
// own actor system and JetStream handle, the node's store and subjects.
func (w *sagaWorld) startSagas(nodeID string, policy safety.InputPolicy) (*saga.Sagas, *prometheus.Registry) {
	w.t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quietLogger() }))
	js, err := jetstream.New(w.env.NATS)
	if err != nil {
		w.t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := saga.Start(saga.Config{System: sys, Store: w.node.Store(), JS: js, Subjects: w.node.Subjects(),
		Policy: policy, NodeID: nodeID, Metrics: reg, Log: quietLogger(),
		Poll: 100 * time.Millisecond, StepBudget: 10 * time.Second})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Stop(ctx)
	})
	return s, reg
}

// step builds workflow step i whose compensation runs on compTopic and
// carries UNDO=<step job id>.
func step(wf string, i int32, compTopic string) *capv1.JobRequest {
	id := fmt.Sprintf("%s-s%d", wf, i)
	r := echoReq(id)
	r.WorkflowId, r.StepIndex = wf, i
	r.Compensation = &capv1.Compensation{Topic: compTopic, Capability: "undo", Env: map[string]string{"UNDO": id}}
	return r
}

// runSteps runs the steps in order, each to its terminal state.
func (w *sagaWorld) runSteps(steps []*capv1.JobRequest, failAt int32) {
	w.t.Helper()
	for _, s := range steps {
		w.submit(s)
		want := jobstate.StateSucceeded
		if s.StepIndex == failAt {
			want = jobstate.StateFailed
		}
		w.waitState(s.JobId, want)
	}
}

// waitRollback waits (bounded) until the workflow's rollback has an outcome.
func (w *sagaWorld) waitRollback(wf string) *saga.Progress {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last *saga.Progress
	for time.Now().Before(deadline) {
		p, err := saga.ReadProgress(context.Background(), w.node.Store(), wf)
		if err == nil {
			last = p
			if p.Status != "" && p.Status != saga.StatusRunning {
				return p
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.t.Fatalf("rollback of %s has no outcome; progress %+v", wf, last)
	return nil
}

// compIDs are the compensation job ids the worker received, in order.
func (w *sagaWorld) compIDs() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]string, len(w.comps))
	for i, c := range w.comps {
		ids[i] = c.JobId
	}
	return ids
}

func sagaCounter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var v float64
			for _, m := range mf.GetMetric() {
				v += m.GetCounter().GetValue()
			}
			return v
		}
	}
	return 0
}

func sameIDs(a, b []string) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// A workflow whose third step fails fatally gets the compensations of its
// second and first steps, in that order, each once, marked as
// compensations of the workflow.
func TestSagaRollbackCompensatesInReverseOrderOnce(t *testing.T) {
	t.Parallel()
	w := newSagaWorld(t, 3)
	_, reg := w.startSagas("node-a", safety.AllowAll{})
	const wf = "wf-lifo"
	w.runSteps([]*capv1.JobRequest{step(wf, 1, "job.echo"), step(wf, 2, "job.echo"), step(wf, 3, "job.echo")}, 3)

	p := w.waitRollback(wf)
	if p.Status != saga.StatusCompleted {
		t.Fatalf("status %s, steps %+v", p.Status, p.Steps)
	}
	c1, c2 := saga.CompensationJobID(wf, wf+"-s1"), saga.CompensationJobID(wf, wf+"-s2")
	if got := w.compIDs(); !sameIDs(got, []string{c2, c1}) {
		t.Fatalf("compensations received %v, want [%s %s]", got, c2, c1)
	}
	w.mu.Lock()
	for i, undo := range []string{wf + "-s2", wf + "-s1"} {
		c := w.comps[i]
		if c.Env["UNDO"] != undo || c.Labels[saga.LabelCompensation] != "true" ||
			c.Labels[saga.LabelWorkflow] != wf || c.Env[saga.LabelIsCompensation] != "true" ||
			c.Priority != capv1.JobPriority_JOB_PRIORITY_CRITICAL {
			t.Errorf("compensation %d: env %v labels %v priority %v", i, c.Env, c.Labels, c.Priority)
		}
	}
	w.mu.Unlock()
	for _, id := range []string{wf + "-s1", wf + "-s2"} {
		if sp := p.Steps[id]; sp.Outcome != saga.OutcomeSucceeded || sp.State != jobstate.StateSucceeded {
			t.Errorf("step %s progress %+v", id, sp)
		}
	}
	if n := sagaCounter(t, reg, "troupe_saga_compensation_dispatched_total"); n != 2 {
		t.Errorf("dispatched metric %v, want 2", n)
	}
	// The rollback is over: its trigger is cleared (the runner records the
	// outcome first, then clears the trigger, so a crash in between re-runs
	// a finished rollback rather than forgetting an unfinished one) and a
	// later poll dispatches nothing more.
	var rep *saga.Report
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if rep, err = saga.Describe(context.Background(), w.node.Store(), wf); err != nil {
			t.Fatal(err)
		}
		if !rep.Triggered || time.Now().After(deadline) {
			break
		}
	}
	if rep.Triggered || len(rep.Steps) != 2 || rep.Steps[0].CompState != jobstate.StateSucceeded {
		t.Fatalf("report %+v", rep)
	}
}

// A rollback whose runner stops after dispatching the first compensation
// is resumed by another runner, and each compensation is dispatched once.
func TestSagaRollbackResumesOnAnotherRunnerWithoutRedispatch(t *testing.T) {
	t.Parallel()
	w := newSagaWorld(t, 3)
	const wf = "wf-resume"
	c1, c2 := saga.CompensationJobID(wf, wf+"-s1"), saga.CompensationJobID(wf, wf+"-s2")
	release := make(chan struct{})
	w.hold = func(req *capv1.JobRequest) {
		if req.JobId == c2 {
			select { // the first compensation stays in flight until the runner changed
			case <-release:
			case <-time.After(20 * time.Second):
			}
		}
	}
	a, regA := w.startSagas("node-a", safety.AllowAll{})
	w.runSteps([]*capv1.JobRequest{step(wf, 1, "job.echo"), step(wf, 2, "job.echo"), step(wf, 3, "job.echo")}, 3)

	select {
	case id := <-w.compIn:
		if id != c2 {
			t.Fatalf("first compensation %s, want %s", id, c2)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no compensation dispatched")
	}
	// The worker can hold the compensation before runner a has read its
	// publish acknowledgement; stopping a then would cancel that wait and
	// a would not count the publish it made. Stop it once it has.
	for deadline := time.Now().Add(10 * time.Second); sagaCounter(t, regA, "troupe_saga_compensation_dispatched_total") < 1; {
		if time.Now().After(deadline) {
			t.Fatal("runner a never counted its first compensation")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		t.Fatalf("stop runner a: %v", err)
	}
	p, err := saga.ReadProgress(ctx, w.node.Store(), wf)
	if err != nil {
		t.Fatal(err)
	}
	if p.Status != saga.StatusRunning || p.Steps[wf+"-s2"].Outcome.Final() {
		t.Fatalf("after stop: status %s, steps %+v", p.Status, p.Steps)
	}
	_, regB := w.startSagas("node-b", safety.AllowAll{})
	close(release)

	p = w.waitRollback(wf)
	if p.Status != saga.StatusCompleted || p.Runs != 2 {
		t.Fatalf("status %s runs %d, steps %+v", p.Status, p.Runs, p.Steps)
	}
	if got := w.compIDs(); !sameIDs(got, []string{c2, c1}) {
		t.Fatalf("compensations received %v, want [%s %s] once each", got, c2, c1)
	}
	da, db := sagaCounter(t, regA, "troupe_saga_compensation_dispatched_total"),
		sagaCounter(t, regB, "troupe_saga_compensation_dispatched_total")
	if da != 1 || db != 1 {
		t.Fatalf("published by a %v, by b %v; want 1 and 1", da, db)
	}
}

// A compensation the policy denies is not dispatched; the denial and its
// reason are recorded and the rollback goes on.
func TestSagaDeniedCompensationIsSkippedAndRecorded(t *testing.T) {
	t.Parallel()
	w := newSagaWorld(t, 3)
	w.startSagas("node-a", safety.TopicRules{Deny: []string{"job.undo-denied"}})
	const wf = "wf-deny"
	w.runSteps([]*capv1.JobRequest{step(wf, 1, "job.echo"), step(wf, 2, "job.undo-denied"), step(wf, 3, "job.echo")}, 3)

	p := w.waitRollback(wf)
	if p.Status != saga.StatusCompletedWithSkips {
		t.Fatalf("status %s, steps %+v", p.Status, p.Steps)
	}
	denied := p.Steps[wf+"-s2"]
	if denied.Outcome != saga.OutcomeDenied || denied.Detail == "" {
		t.Fatalf("denied step progress %+v", denied)
	}
	if got, c1 := w.compIDs(), saga.CompensationJobID(wf, wf+"-s1"); !sameIDs(got, []string{c1}) {
		t.Fatalf("compensations received %v, want only [%s]", got, c1)
	}
	if _, err := w.node.Job(context.Background(), saga.CompensationJobID(wf, wf+"-s2")); err != store.ErrNotFound {
		t.Fatalf("denied compensation has a job record (err %v)", err)
	}
}

// A template that does not decode is dead-lettered with
// saga_unmarshal_failed, and the other compensations still run.
func TestSagaCorruptTemplateIsDeadLetteredAndRollbackContinues(t *testing.T) {
	t.Parallel()
	w := newSagaWorld(t, 3)
	_, reg := w.startSagas("node-a", safety.AllowAll{})
	const wf = "wf-corrupt"
	w.runSteps([]*capv1.JobRequest{step(wf, 1, "job.echo"), step(wf, 2, "job.echo")}, 3)
	// Not a protobuf: 0xff starts a field tag that never ends.
	if err := w.env.Redis.HSet(context.Background(), saga.TemplatesKey(w.node.Store().Keys(), store.Shard(wf+"-s2"), wf),
		saga.StepTemplateField(wf+"-s2"), string([]byte{0xff, 0xff, 0xff, 0xff}),
	).Err(); err != nil {
		t.Fatal(err)
	}
	w.runSteps([]*capv1.JobRequest{step(wf, 3, "job.echo")}, 3)

	e := w.waitDLQ(func(e store.DLQEntry) bool { return e.Reason == saga.ReasonUnmarshalFailed })
	if e.JobID != wf+"-s2" {
		t.Fatalf("dlq entry for %s, want %s-s2", e.JobID, wf)
	}
	p := w.waitRollback(wf)
	if p.Status != saga.StatusCompletedWithSkips || p.Steps[wf+"-s2"].Outcome != saga.OutcomeUnmarshalFailed ||
		p.Steps[wf+"-s1"].Outcome != saga.OutcomeSucceeded {
		t.Fatalf("status %s, steps %+v", p.Status, p.Steps)
	}
	if got, c1 := w.compIDs(), saga.CompensationJobID(wf, wf+"-s1"); !sameIDs(got, []string{c1}) {
		t.Fatalf("compensations received %v, want only [%s]", got, c1)
	}
	if n := sagaCounter(t, reg, "troupe_saga_unmarshal_error_total"); n != 1 {
		t.Fatalf("unmarshal metric %v", n)
	}
}
