package jobactor

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/signing"
)

// opSink keeps store ops on the heap, as the writer's queue does.
var opSink *store.Op

// lifeInputs is the core's Inputs for an allocation count: a fixed clock
// and write id.
type lifeInputs struct{ now time.Time }

func (i *lifeInputs) Now() time.Time                    { return i.now }
func (i *lifeInputs) OpID() uint64                      { return 7 }
func (i *lifeInputs) GraceRoom() bool                   { return true }
func (i *lifeInputs) DataLost() bool                    { return false }
func (i *lifeInputs) Connected() bool                   { return true }
func (i *lifeInputs) Count(lifecycle.Metric, string)    {}
func (i *lifeInputs) Observe(lifecycle.Metric, float64) {}

// jobLife runs one job's happy life (submit, allow, pick, create
// DISPATCHED, progress → RUNNING, result → SUCCEEDED) through the core and
// the shell's translations at its edges: each write becomes a store op
// (storeOp), each store outcome (allocated as the store's writer does)
// becomes the core's (writeResult), the policy's answer a PolicyDone
// (policyDone).
func jobLife(t *testing.T) {
	cfg := &lifecycle.Config{NodeID: "n1", IdemKey: func(a, b string) string { return a + b },
		TenantKey: func(t string) string { return t }, Dispatch: 5 * time.Minute,
		RunningFor: func(string) time.Duration { return time.Hour },
		Backoff:    func(int) time.Duration { return time.Second }, MaxSchedulingAttempts: 5,
		ParkAfter: 10 * time.Second, ResendAfter: -1}
	j := lifecycle.New(cfg, "job-1", 0)
	in := &lifeInputs{now: time.Unix(1_000_000, 0)}
	var epoch uint64
	sop := new(store.Op) // the actor's one store op (writeOp), refilled per write
	feed := func(ev any) {
		for _, e := range j.Step(ev, in) {
			switch e := e.(type) {
			case *lifecycle.Write:
				fillStoreOp(sop, e.Op)
				epoch, opSink = e.Epoch, sop
			case *lifecycle.AskPolicy:
				epoch = e.Epoch
			case *lifecycle.AskRouter:
				epoch = e.Req.(*lifecycle.PickRequest).Epoch
			}
		}
		j.Consumed() // as the actor does after each step
	}
	written := func(r *store.Result) { feed(&lifecycle.WriteDone{Epoch: epoch, Res: writeResult(r)}) }
	feed(&lifecycle.Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}, TraceID: "t-1"})
	feed(policyDone(epoch, &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}, nil))
	feed(&lifecycle.PickReply{Epoch: epoch, WorkerID: "w1", Subject: "worker.w1.jobs"})
	written(&store.Result{Status: store.ActivateCreated, State: jobstate.StateDispatched, Fence: 1})
	feed(&lifecycle.Progress{P: &capv1.JobProgress{JobId: "job-1"}, From: "w1"})
	written(&store.Result{Step: store.StepOK})
	feed(&lifecycle.Result{Res: &capv1.JobResult{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, WorkerId: "w1"}})
	written(&store.Result{Step: store.StepOK})
	if j.State != jobstate.StateSucceeded || opSink == nil {
		t.Fatalf("the life ended %s", j.State)
	}
}

// The shell's translations between the core and the store allocate what
// the core's store ops used to and no more: one store op per write (the
// core keeps its own write inside its pending step, allocating none), no
// allocation for an outcome (the core's result travels by value in its
// WriteDone) or a sender. The count of a whole job's life through the core
// and these translations is bounded (jobLifeAllocsMax; go test -v -run
// TestShellTranslation logs it); the shell refills one store op per actor
// (writeOp), as jobLife does.
func TestShellTranslationAllocations(t *testing.T) {
	op := &lifecycle.Op{Kind: lifecycle.OpTransition, JobID: "j", Node: "n", LockValue: "n|1",
		T: &jobstate.Transition{Path: []jobstate.Hop{{To: jobstate.StateRunning}}}}
	r := &store.Result{Step: store.StepOK}
	p := &signing.Principal{Sender: "w1", Role: signing.RoleWorker}
	var res lifecycle.WriteResult
	var by lifecycle.Sender
	if n := testing.AllocsPerRun(100, func() { opSink = storeOp(op) }); n != 1 {
		t.Errorf("storeOp allocates %.0f, want 1 (the store op)", n)
	}
	if n := testing.AllocsPerRun(100, func() { res = writeResult(r) }); n != 0 {
		t.Errorf("writeResult allocates %.0f, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { by = By(p) }); n != 0 {
		t.Errorf("By allocates %.0f, want 0", n)
	}
	_, _ = res, by
	if op := storeOp(op); op.Kind != store.OpTransition || op.T == nil || op.LockValue != "n|1" {
		t.Errorf("storeOp: %+v", op)
	}
	n := testing.AllocsPerRun(200, func() { jobLife(t) })
	t.Logf("allocations per job life through the core and the shell's translations: %.0f", n)
	if n > jobLifeAllocsMax && !raceEnabled {
		t.Errorf("a job's life through the core and the shell's translations allocates %.0f, want at most %d",
			n, jobLifeAllocsMax)
	}
}

// jobLifeAllocsMax bounds jobLife's allocations: 32 since the node cuts of
// round 7 (BENCHMARKS.md); a change that adds one to every job's life
// raises it on purpose or finds another to cut.
const jobLifeAllocsMax = 32

type writeDoneSink struct{ got chan *lifecycle.WriteDone }

func (s *writeDoneSink) Receive(c actor.Context) {
	if m, ok := c.Message().(*lifecycle.WriteDone); ok {
		s.got <- m
	}
}

// An actor's one store op is free for its next write exactly once the
// writer completed it, and its completion answers with the epoch of the
// write it carried (not of a later one).
func TestWriteOpAnswersItsEpochAndIsFreeOnceComplete(t *testing.T) {
	sys := actor.NewActorSystem()
	sink := &writeDoneSink{got: make(chan *lifecycle.WriteDone, 2)}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink }))
	w := newWriteOp(pid, sys.Root)
	fillStoreOp(&w.op, &lifecycle.Op{Kind: lifecycle.OpTransition, JobID: "j1", LockValue: "lv"})
	w.epoch = 7
	w.op.Done = w.done
	w.inFlight.Store(true)
	w.op.Done(&store.Result{Step: store.StepOK})
	if w.inFlight.Load() {
		t.Fatal("completed op still in flight: the actor would allocate a new one")
	}
	select {
	case d := <-sink.got:
		if d.Epoch != 7 || d.Res.Step != lifecycle.StepOK {
			t.Fatalf("WriteDone %+v, want epoch 7 and OK", d)
		}
		w.consumed(d) // as the actor does once its step read it
	case <-time.After(5 * time.Second):
		t.Fatal("no WriteDone")
	}
	// Refilled for the next write: nothing of the last one is left.
	fillStoreOp(&w.op, &lifecycle.Op{Kind: lifecycle.OpRelease, JobID: "j1", LockValue: "lv2"})
	if w.op.Kind != store.OpRelease || w.op.LockValue != "lv2" || w.op.Done != nil {
		t.Fatalf("refilled op %+v", w.op)
	}
	// An actor that stops with its op still at the writer keeps it out of
	// the pool: the writer may still read it, and its completion still
	// answers the stopped actor.
	w.inFlight.Store(true)
	w.release()
	if w.op.JobID != "j1" || w.self != pid {
		t.Fatal("an op still with the writer was cleared for another actor")
	}
	w.inFlight.Store(false)
	w.release()
	if w.op.JobID != "" || w.self != nil {
		t.Fatal("a released op keeps its job's data")
	}
}

// A writeOp's own WriteDone is sent again only once its actor has read the
// last one: a completion that finds its answer unread sends one of its
// own (the unread one keeps its epoch and outcome), and an op whose answer
// was never read stays out of the pool.
func TestWriteOpAnswerIsReusedOnlyOnceRead(t *testing.T) {
	sys := actor.NewActorSystem()
	sink := &writeDoneSink{got: make(chan *lifecycle.WriteDone, 4)}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink }))
	w := newWriteOp(pid, sys.Root)
	complete := func(epoch uint64, r *store.Result) *lifecycle.WriteDone {
		t.Helper()
		fillStoreOp(&w.op, &lifecycle.Op{Kind: lifecycle.OpTransition, JobID: "j1", LockValue: "lv"})
		w.epoch = epoch
		w.op.Done = w.done
		w.inFlight.Store(true)
		w.op.Done(r)
		select {
		case d := <-sink.got:
			return d
		case <-time.After(5 * time.Second):
			t.Fatal("no WriteDone")
		}
		return nil
	}
	first := complete(1, &store.Result{Step: store.StepOK})
	if first != &w.msg {
		t.Fatal("the first answer is not the op's own")
	}
	// Unread: the next completion may not overwrite it.
	second := complete(2, &store.Result{Step: store.StepFenced})
	if second == first || first.Epoch != 1 || first.Res.Step != lifecycle.StepOK {
		t.Fatalf("an unread answer was overwritten: first %+v, second %p", first, second)
	}
	if second.Epoch != 2 || second.Res.Step != lifecycle.StepFenced {
		t.Fatalf("second answer %+v, want epoch 2, fenced", second)
	}
	w.consumed(second) // not the op's own: its own stays out
	if third := complete(3, &store.Result{Step: store.StepOK}); third == first {
		t.Fatal("the op's own answer reused before its actor read it")
	}
	// An op whose own answer is unread stays out of the pool.
	w.release()
	if w.self != pid {
		t.Fatal("an op whose answer is unread went back to the pool")
	}
	w.consumed(first)
	if fourth := complete(4, &store.Result{Step: store.StepOK}); fourth != first || fourth.Epoch != 4 {
		t.Fatalf("once read, the op's own answer is not reused: %p %+v", fourth, fourth)
	}
	w.consumed(first)
	w.release()
	if w.self != nil {
		t.Fatal("a read, completed op was not released")
	}
}
