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
