package troupe_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/testenv"
)

// BenchmarkCapacityWaitingJobs measures what jobs waiting for capacity
// cost: one worker of max_parallel 1 holds its job, and 10,000 more jobs
// wait for it in the router's queue; then 10 jobs, for comparison.
// Reported: the node's heap per waiting job (after a GC), and the Redis
// commands the server runs per second while they wait (the node's lease
// and pollers; the same with 10 or 10,000 waiting if nothing is per job).
// Run with
//
//	go test -run '^$' -bench CapacityWaitingJobs -benchtime 1x .
//
// "unwritten" runs the default capacity grace (1 min): the jobs wait with no
// record, their submits held in JetStream and touched every 4 s; it also
// reports those in-progress signals per waiting job per second. "written"
// has a 100 ms grace, so every waiting job is written SCHEDULED.
func BenchmarkCapacityWaitingJobs(b *testing.B) {
	for _, mode := range []string{"unwritten", "written"} {
		for _, n := range []int{10, 10000} {
			b.Run(mode+"/"+strconv.Itoa(n), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					perJob, redisPerSec, touches := waitingJobsOnce(b, n, mode == "written")
					b.ReportMetric(perJob, "heap_B/waiting_job")
					b.ReportMetric(redisPerSec, "redis_cmds/s_while_waiting")
					b.ReportMetric(touches, "touches/s/waiting_job")
				}
			})
		}
	}
}

func waitingJobsOnce(b *testing.B, waiting int, written bool) (perJob, redisPerSec, touchesPerJobSec float64) {
	env := testenv.New(b)
	pools, _ := parseTestPools()
	grace, metric := time.Duration(0), "troupe_capacity_waits_unwritten"
	if written {
		grace, metric = 100*time.Millisecond, "troupe_capacity_waits_total"
	}
	node, err := troupe.NewNode(troupe.Config{NodeID: "bench-wait", NATSURL: env.NATSURL, RedisURL: env.RedisURL,
		KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(),
		Pools: pools, Logger: quietLogger(), Tuning: troupe.Tuning{CapacityGrace: grace}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := node.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer node.Stop(ctx)
	g := newJobGates()
	w := startCapWorker(b, env.NATS, node.Subjects(), "holder", 1, 5*time.Second, g.wait)
	defer func() {
		for i := 0; i <= waiting; i++ {
			select {
			case g.gate("wait-" + strconv.Itoa(i)) <- false:
			default:
			}
		}
	}()
	js, err := jetstream.New(env.NATS)
	if err != nil {
		b.Fatal(err)
	}
	submit := func(id string) {
		data, err := bus.EncodeRequest("trace-"+id, "bench", echoReq(id))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishAsync(node.Subjects().Submit, data); err != nil {
			b.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if ws, _ := node.Workers(); len(ws) == 1 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("no worker")
		}
		time.Sleep(10 * time.Millisecond)
	}
	submit("wait-0")
	w.waitGot(10 * time.Second)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 1; i <= waiting; i++ {
		submit("wait-" + strconv.Itoa(i))
	}
	<-js.PublishAsyncComplete()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if counter(b, node, metric, "") >= float64(waiting) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %v of %d jobs wait", counter(b, node, metric, ""), waiting)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // the last writes' replies
	runtime.GC()
	runtime.ReadMemStats(&after)
	perJob = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(waiting)
	first, touched := redisCommands(b, env), counter(b, node, "troupe_submit_progress_touches_total", "")
	const window = 10 * time.Second
	time.Sleep(window)
	redisPerSec = float64(redisCommands(b, env)-first) / window.Seconds()
	touchesPerJobSec = (counter(b, node, "troupe_submit_progress_touches_total", "") - touched) / window.Seconds() / float64(waiting)
	b.Logf("%d jobs waiting (written: %v): %.0f B of heap each, %.1f Redis commands/s while they wait (server-wide), %.3f touches/s per waiting job",
		waiting, written, perJob, redisPerSec, touchesPerJobSec)
	return perJob, redisPerSec, touchesPerJobSec
}

// redisCommands reads the server's total_commands_processed.
func redisCommands(b *testing.B, env *testenv.Env) int64 {
	info, err := env.Redis.Info(context.Background(), "stats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("no total_commands_processed in INFO stats")
	return 0
}

// BenchmarkCapacityTwoReplicas: two nodes share ten workers that announce
// max_parallel 4 and take 50 ms a job (capacity 800 jobs/s); 8,000 jobs
// are submitted at once. Reported: throughput as a share of the workers'
// capacity, receipts a worker took while already holding 4 (must be 0),
// and capacity waits per job. Run with
//
//	go test -run '^$' -bench CapacityTwoReplicas -benchtime 1x .
func BenchmarkCapacityTwoReplicas(b *testing.B) {
	for i := 0; i < b.N; i++ {
		twoReplicasOnce(b, 8000)
	}
}

func twoReplicasOnce(b *testing.B, jobs int) {
	env := testenv.New(b)
	pools, _ := parseTestPools()
	ctx := context.Background()
	var nodes []*troupe.Node
	for _, id := range []string{"rep-a", "rep-b"} {
		n, err := troupe.NewNode(troupe.Config{NodeID: id, NATSURL: env.NATSURL, RedisURL: env.RedisURL,
			KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(),
			Pools: pools, Logger: quietLogger()})
		if err != nil {
			b.Fatal(err)
		}
		if err := n.Start(ctx); err != nil {
			b.Fatal(err)
		}
		defer n.Stop(ctx)
		nodes = append(nodes, n)
	}
	var ws []*capWorker
	for i := range 10 {
		ws = append(ws, startCapWorkerMode(b, env.NATS, nodes[0].Subjects(), "cap"+strconv.Itoa(i), 4, 5*time.Second,
			func(string) bool { time.Sleep(50 * time.Millisecond); return true }, true))
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		wa, _ := nodes[0].Workers()
		wb, _ := nodes[1].Workers()
		if len(wa) == 10 && len(wb) == 10 && wa[0].Steward == wb[0].Steward && wa[9].Steward == wb[9].Steward {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("nodes never saw the workers")
		}
		time.Sleep(10 * time.Millisecond)
	}
	js, err := jetstream.New(env.NATS)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for i := range jobs {
		id := "two-" + strconv.Itoa(i)
		data, err := bus.EncodeRequest("trace-"+id, "bench", echoReq(id))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := js.PublishAsync(nodes[0].Subjects().Submit, data); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		done := counter(b, nodes[0], "troupe_jobs_completed_total", "SUCCEEDED") +
			counter(b, nodes[1], "troupe_jobs_completed_total", "SUCCEEDED")
		if done >= float64(jobs) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%v of %d jobs SUCCEEDED", done, jobs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	over, maxHeld := fleetCounts(ws)
	waits := counter(b, nodes[0], "troupe_capacity_waits_total", "pool_overloaded") +
		counter(b, nodes[1], "troupe_capacity_waits_total", "pool_overloaded")
	rate := float64(jobs) / elapsed.Seconds()
	b.ReportMetric(rate, "jobs/s")
	b.ReportMetric(100*rate/800, "%_of_capacity")
	b.ReportMetric(float64(over), "overfills")
	b.ReportMetric(waits/float64(jobs), "waits/job")
	b.Logf("two replicas, 10 workers × 4 slots, 50 ms jobs: %d jobs in %v = %.0f jobs/s (%.1f %% of 800); max held %d, overfills %d, %.2f waits/job",
		jobs, elapsed.Round(time.Millisecond), rate, 100*rate/800, maxHeld, over, waits/float64(jobs))
	if over != 0 {
		b.Errorf("%d receipts over max_parallel", over)
	}
}
