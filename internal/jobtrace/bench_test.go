package jobtrace_test

import (
	"log/slog"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/jobtrace"
)

// Messages through one job-like actor, sent from outside as the intake and
// the store writer send them (Root.Send, no sender). The three variants
// differ only in the props:
//
//	BenchmarkTraceNone  props with no middleware (the node without tracing)
//	BenchmarkTraceOff   props built with a disabled tracer's options
//	BenchmarkTraceOn    props with the tracing middleware (ring of 64)
//
// Off builds the very same props as None — the point of the design — so
// the two must agree within noise.

// benchJob flips between two states like a job between transitions and
// signals when it has seen n messages.
type benchJob struct {
	state, reason string
	n, seen       int
	done          chan struct{}
}

func (j *benchJob) TraceState() (string, string) { return j.state, j.reason }

var benchStates = [2]string{"DISPATCHED", "RUNNING"}

func (j *benchJob) Receive(c actor.Context) {
	if _, ok := c.Message().(*stored); !ok {
		return
	}
	j.seen++
	j.state, j.reason = benchStates[j.seen&1], "bench"
	if j.seen == j.n {
		close(j.done)
	}
}

func benchMessages(b *testing.B, opts []actor.PropsOption) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	j := &benchJob{n: b.N, done: make(chan struct{})}
	pid, err := sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return j }, opts...), "jobs-0/job-bench")
	if err != nil {
		b.Fatal(err)
	}
	msg := &stored{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sys.Root.Send(pid, msg)
	}
	<-j.done
	b.StopTimer()
	sys.Root.Stop(pid)
}

func BenchmarkTraceNone(b *testing.B) { benchMessages(b, nil) }

func BenchmarkTraceOff(b *testing.B) {
	tr, err := jobtrace.New(nil, jobtrace.Config{Enabled: false})
	if err != nil {
		b.Fatal(err)
	}
	benchMessages(b, tr.PropsOptions())
}

func BenchmarkTraceOn(b *testing.B) {
	// No Redis: this measures the per-message cost; persisting happens once
	// per job, when its actor stops.
	tr, err := jobtrace.New(nil, jobtrace.Config{Enabled: true, NodeID: "bench", Log: quiet()})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	benchMessages(b, tr.PropsOptions())
}
