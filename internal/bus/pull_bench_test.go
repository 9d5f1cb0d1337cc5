package bus_test

import (
	"context"
	"io"
	"log/slog"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/testenv"
)

// cpuTime is the process's CPU time (user + system) in nanoseconds.
func cpuTime() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkFetchLoop reads b.N messages already in a stream and acks each,
// through nats.go's Fetch in a loop (what Consume did before) and through
// Consume's own pulls; against the shared NATS server, so allocations
// are the client's alone; cpu-ns/msg is the process's CPU time per
// message (ns/op is mostly waiting on a loaded machine).
func BenchmarkFetchLoop(b *testing.B) {
	for _, name := range []string{"nats.go-Fetch", "Consume"} {
		b.Run(name, func(b *testing.B) {
			env := testenv.New(b)
			js, err := jetstream.New(env.NATS)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			subj := bus.NewSubjects(env.Prefix)
			prefix := env.StreamPrefix()
			if err := bus.EnsureStreams(ctx, js, prefix, subj); err != nil {
				b.Fatal(err)
			}
			defer func() {
				for _, k := range []bus.StreamKind{bus.StreamSubmit, bus.StreamResult, bus.StreamCancel} {
					_ = js.DeleteStream(context.Background(), bus.StreamName(prefix, k))
				}
			}()
			body := make([]byte, 600)
			for i := 0; i < b.N; i++ {
				if _, err := js.PublishAsync(subj.Result, body); err != nil {
					b.Fatal(err)
				}
			}
			<-js.PublishAsyncComplete()
			done := make(chan struct{})
			n := 0
			handle := func(m jetstream.Msg) {
				_ = m.Ack()
				if n++; n == b.N {
					close(done)
				}
			}
			b.ReportAllocs()
			cpu0 := cpuTime()
			defer func() { b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/msg") }()
			b.ResetTimer()
			if name == "Consume" {
				mu := make(chan struct{}, 1) // handle is called from two loops
				locked := func(m jetstream.Msg) { mu <- struct{}{}; handle(m); <-mu }
				if err := bus.Consume(ctx, js, prefix, bus.StreamResult, slog.New(slog.NewTextHandler(io.Discard, nil)), locked, nil); err != nil {
					b.Fatal(err)
				}
				<-done
				return
			}
			cons, err := js.Consumer(ctx, bus.StreamName(prefix, bus.StreamResult), bus.ConsumerName(bus.StreamResult))
			if err != nil {
				b.Fatal(err)
			}
			for n < b.N {
				batch, err := cons.Fetch(bus.FetchBatch, jetstream.FetchMaxWait(bus.FetchMaxWait))
				if err != nil {
					b.Fatal(err)
				}
				for m := range batch.Messages() {
					handle(m)
				}
			}
		})
	}
}
