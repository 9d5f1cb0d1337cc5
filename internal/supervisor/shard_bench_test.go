package supervisor_test

import (
	"io"
	"log/slog"
	"strconv"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/supervisor"
)

// benchEnd is the last event of a benchmark job: its actor finishes.
type benchEnd struct{}

// benchJob finishes on benchEnd and tells done.
type benchJob struct {
	id   string
	done chan struct{}
}

func (j *benchJob) Receive(c actor.Context) {
	switch c.Message().(type) {
	case *actor.Started:
		j.id = c.Self().Id
	case *benchEnd:
		c.Send(c.Parent(), &jobactor.Finished{JobID: j.id[len(c.Parent().Id)+1:], PID: c.Self()})
		j.done <- struct{}{}
	}
}

// BenchmarkShardJob is a job's life through a shard as the node drives it
// (its first event spawns its actor, two more reach it, its last makes it
// finish; the shard poisons it and forgets it once it has terminated),
// with window jobs in flight at once; cpu-ns/op is the process's CPU time
// per job (the actor's spawn and stop included).
func BenchmarkShardJob(b *testing.B) {
	const window = 512
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	defer sys.Shutdown()
	d := supervisor.NewPoolDispatcher()
	defer d.Close()
	done := make(chan struct{}, window)
	job := actor.PropsFromProducer(func() actor.Actor { return &benchJob{done: done} }, supervisor.OnPool(d))
	shard := sys.Root.Spawn(supervisor.ShardPropsResolving(job, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, supervisor.OnPool(d)))
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = "01JD" + strconv.FormatInt(int64(i)*7919+1e15, 36) + "-job"
	}
	end := &benchEnd{}
	b.ReportAllocs()
	cpu0 := cpuTime()
	defer func() { b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op") }()
	b.ResetTimer()
	inFlight := 0
	for i := 0; i < b.N; i++ {
		if inFlight == window {
			<-done
			inFlight--
		}
		id := ids[i%len(ids)]
		sys.Root.Send(shard, &supervisor.Deliver{JobID: id, Msg: 1, Spawn: true})
		sys.Root.Send(shard, &supervisor.Deliver{JobID: id, Msg: 2})
		sys.Root.Send(shard, &supervisor.Deliver{JobID: id, Msg: 3})
		sys.Root.Send(shard, &supervisor.Deliver{JobID: id, Msg: end})
		inFlight++
	}
	for ; inFlight > 0; inFlight-- {
		<-done
	}
}
