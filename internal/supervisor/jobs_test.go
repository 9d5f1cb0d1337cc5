package supervisor_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/proto/capv1"
)

// A result heard on the result subject (intake.HandleOwnResult: Spawn
// false) for a job parked on this node does not start the job's actor — a
// hold's answers, heard at once and not paced by NATS, started one per
// parked job — and the job stays parked; the result stream's shared copy
// (Spawn true) starts it and reaches it.
func TestHeardResultDoesNotWakeAParkedJob(t *testing.T) {
	sys := actor.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	got := make(chan *jobactor.Result, 4)
	job := actor.PropsFromFunc(func(c actor.Context) {
		if r, ok := c.Message().(*jobactor.Result); ok {
			got <- r
		}
	})
	shard := sys.Root.Spawn(supervisor.ShardPropsResolving(job, slog.New(slog.NewTextHandler(io.Discard, nil)), nil))
	count := func(q interface{}) int {
		t.Helper()
		res, err := sys.Root.RequestFuture(shard, q, 5*time.Second).Result()
		if err != nil {
			t.Fatal(err)
		}
		return res.(int)
	}
	res := &capv1.JobResult{JobId: "parked-1", WorkerId: "w1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}

	sys.Root.Send(shard, &supervisor.RememberParked{JobIDs: []string{"parked-1"}})
	sys.Root.Send(shard, &supervisor.Deliver{JobID: "parked-1", Msg: &jobactor.Result{Res: res, Heard: true}})
	// One sender's messages reach the shard in order: the counts follow
	// the heard result's handling.
	if n := count(&supervisor.CountLive{}); n != 0 {
		t.Fatalf("%d job actors live after a heard result for a parked job, want 0", n)
	}
	if n := count(&supervisor.CountParked{}); n != 1 {
		t.Fatalf("%d jobs parked after a heard result for a parked job, want 1", n)
	}

	sys.Root.Send(shard, &supervisor.Deliver{JobID: "parked-1", Msg: &jobactor.Result{Res: res}, Spawn: true})
	select {
	case r := <-got:
		if r.Heard {
			t.Fatal("the job's actor got the heard copy, want the shared copy")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the shared copy did not reach the job's actor")
	}
	if n := count(&supervisor.CountParked{}); n != 0 {
		t.Fatalf("%d jobs parked once the shared copy started the job's actor, want 0", n)
	}
	select {
	case r := <-got:
		t.Fatalf("the job's actor got a second result (heard %v)", r.Heard)
	default:
	}
}

type finish struct{ redeliver []interface{} }

type seen struct {
	actor int // which actor of the job's (a fresh one has the same PID)
	msg   interface{}
}

// oneJob is a job actor that reports the events it gets, and finishes when
// told to.
type oneJob struct {
	n        int
	got      chan seen
	finished chan struct{}
}

func (j *oneJob) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *finish:
		c.Send(c.Parent(), &jobactor.Finished{JobID: "j1", PID: c.Self(), Redeliver: m.redeliver})
		j.finished <- struct{}{}
	case string:
		j.got <- seen{j.n, m}
	case *jobactor.Tokens:
		j.got <- seen{j.n, "tokens"}
	}
}

// Events for a job whose actor has finished wait in the shard while that
// actor stops, and go, with the events its Finished hands back, to a fresh
// actor once it has terminated: one job never has two actors. The shard
// counts the fresh actor live, and a job's entry (one a job) is gone with
// its actor: a later event that does not spawn is dropped.
func TestShardHoldsEventsWhileAJobsActorStops(t *testing.T) {
	sys := actor.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	got := make(chan seen, 16)
	finished := make(chan struct{}, 4)
	actors := 0
	job := actor.PropsFromProducer(func() actor.Actor {
		actors++ // on the shard's goroutine, one spawn at a time
		return &oneJob{n: actors, got: got, finished: finished}
	})
	shard := sys.Root.Spawn(supervisor.ShardPropsResolving(job, slog.New(slog.NewTextHandler(io.Discard, nil)), nil))
	count := func() int {
		t.Helper()
		res, err := sys.Root.RequestFuture(shard, &supervisor.CountLive{}, 5*time.Second).Result()
		if err != nil {
			t.Fatal(err)
		}
		return res.(int)
	}
	next := func() seen {
		t.Helper()
		select {
		case s := <-got:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no event reached a job actor")
		}
		return seen{}
	}

	sys.Root.Send(shard, &supervisor.Deliver{JobID: "j1", Msg: "a", Spawn: true})
	first := next()
	sys.Root.Send(shard, &supervisor.Deliver{JobID: "j1", Msg: &finish{redeliver: []interface{}{&jobactor.Tokens{}}}})
	<-finished // the shard has the Finished before the next Deliver
	sys.Root.Send(shard, &supervisor.Deliver{JobID: "j1", Msg: "b", Spawn: true})
	// The handed-back event spawns (a rate limiter's grant does, see
	// spawnsAlways); it was held first.
	for _, want := range []string{"tokens", "b"} {
		s := next()
		if s.msg != want {
			t.Fatalf("event %v reached an actor, want %q", s.msg, want)
		}
		if s.actor == first.actor {
			t.Fatalf("event %q reached the stopping actor", want)
		}
	}
	if n := count(); n != 1 {
		t.Fatalf("%d actors live, want the fresh one", n)
	}

	// The fresh actor finishes with nothing handed back: its entry goes
	// with it, and an event that does not spawn is dropped.
	sys.Root.Send(shard, &supervisor.Deliver{JobID: "j1", Msg: &finish{}})
	<-finished
	if n := count(); n != 0 {
		t.Fatalf("%d actors live after the job's actor finished, want 0", n)
	}
	sys.Root.Send(shard, &supervisor.Deliver{JobID: "j1", Msg: "dropped"})
	if n := count(); n != 0 {
		t.Fatalf("%d actors live after an event that does not spawn, want 0", n)
	}
	select {
	case s := <-got:
		t.Fatalf("event %v reached an actor, want it dropped", s.msg)
	case <-time.After(100 * time.Millisecond):
	}
}
