package supervisor_test

import (
	"io"
	"log/slog"
	"strconv"
	"syscall"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/supervisor"
)

// cpuTime is the process's CPU time (user + system) in nanoseconds.
func cpuTime() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// parent spawns a child per job, sends it three messages (a job's usual
// events), poisons it, and counts the terminations.
type parent struct {
	child *actor.Props
	done  chan struct{}
}

type spawnJob struct{ id string }

func (p *parent) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *spawnJob:
		pid, err := c.SpawnNamed(p.child, m.id)
		if err != nil {
			panic(err)
		}
		for i := 0; i < 3; i++ {
			c.Send(pid, i)
		}
		c.Poison(pid)
	case *actor.Terminated:
		p.done <- struct{}{}
	}
}

// BenchmarkJobActorSpawnStop is one job actor's life on the pool
// dispatcher as a shard runs it (spawn, three messages, poison, the
// parent told of its end), with protoactor's mailbox and with Mailbox;
// cpu-ns/op is the process's CPU time per actor.
func BenchmarkJobActorSpawnStop(b *testing.B) {
	for _, tc := range []struct {
		name    string
		mailbox func(*supervisor.PoolDispatcher) actor.PropsOption
	}{
		{"protoactor", func(d *supervisor.PoolDispatcher) actor.PropsOption { return actor.WithDispatcher(d) }},
		{"Mailbox", supervisor.OnPool},
	} {
		b.Run(tc.name, func(b *testing.B) {
			d := supervisor.NewPoolDispatcher()
			defer d.Close()
			sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
				return slog.New(slog.NewTextHandler(io.Discard, nil))
			}))
			defer sys.Shutdown()
			onPool := tc.mailbox(d)
			child := actor.PropsFromFunc(func(actor.Context) {}, onPool)
			done := make(chan struct{}, 1)
			pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
				return &parent{child: child, done: done}
			}, onPool))
			b.ReportAllocs()
			cpu0 := cpuTime()
			defer func() { b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op") }()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				sys.Root.Send(pid, &spawnJob{id: "job-" + strconv.Itoa(i)})
				<-done
			}
		})
	}
}
