package troupe_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/worker"
)

// BenchmarkRestartNoWorkers measures what a node restart costs placement:
// ten CAP workers heartbeat every 5 s (the SDK default); a node runs, stops,
// and a new node starts while jobs arrive at a steady 100/s for 30 s. A cold
// node knows no worker until each has beaten again, so early jobs fail
// placement with no_workers and back off; a warm node hydrates its registry
// from the snapshot its predecessor wrote. Reported per sub-benchmark:
// no_workers placement failures and jobs that had any. Run with
//
//	go test -run '^$' -bench RestartNoWorkers -benchtime 1x .
func BenchmarkRestartNoWorkers(b *testing.B) {
	for _, mode := range []string{"cold", "warm"} {
		b.Run(mode, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				failures, jobs := restartOnce(b, mode == "warm")
				b.ReportMetric(failures, "no_workers_failures")
				b.ReportMetric(jobs, "jobs_with_no_workers")
			}
		})
	}
}

func restartOnce(b *testing.B, warm bool) (failures, jobsHit float64) {
	env := testenv.New(b)
	pools, _ := parseTestPools()
	cfg := troupe.Config{NodeID: "bench-a", NATSURL: env.NATSURL, RedisURL: env.RedisURL,
		KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(),
		Pools: pools, Logger: quietLogger()}
	a, err := troupe.NewNode(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := a.Start(ctx); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		w, err := worker.Start(env.NATS, worker.Config{ID: fmt.Sprintf("w%d", i), Pool: "echo",
			Topics: []string{"job.echo"}, Direct: true, SubjectPrefix: a.Subjects().Prefix()})
		if err != nil {
			b.Fatal(err)
		}
		defer w.Stop()
	}
	// Let node A see every worker and write at least one snapshot.
	time.Sleep(6 * time.Second)
	_ = a.Stop(ctx)
	if !warm {
		// What a first start, or a snapshot older than its TTL, looks like.
		env.Redis.Del(ctx, env.KeyPrefix()+"{registry}:snapshot")
	}
	cfg.NodeID = "bench-b"
	cfg.Metrics = nil
	nb, err := troupe.NewNode(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := nb.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer nb.Stop(ctx)
	js, err := jetstream.New(env.NATS)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	const rate, seconds = 100, 30
	tick := time.NewTicker(time.Second / rate)
	ids := make([]string, 0, rate*seconds)
	for n := 0; n < rate*seconds; n++ {
		<-tick.C
		id := fmt.Sprintf("rs-%d", n)
		ids = append(ids, id)
		data, _ := bus.EncodeRequest(id, "bench", echoReq(id))
		if _, err := js.Publish(ctx, nb.Subjects().Submit, data); err != nil {
			b.Fatal(err)
		}
	}
	tick.Stop()
	b.StopTimer()
	failures = counter(b, nb, "troupe_scheduling_retries_total", "no_workers")
	for _, id := range ids {
		if r, err := nb.Record(ctx, id); err == nil && r.Fields["last_reason"] == "no_workers" {
			jobsHit++
		}
	}
	return failures, jobsHit
}
