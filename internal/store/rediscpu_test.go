package store_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// redisCPU is the CPU-seconds (user + sys) a redis-server has used.
func redisCPU(t *testing.T, c *redis.Client) float64 {
	t.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (name == "used_cpu_user" || name == "used_cpu_sys") {
			f, _ := strconv.ParseFloat(v, 64)
			sum += f
		}
	}
	return sum
}

// TestHappyPathRedisCPU measures the Redis CPU of the store's happy path per
// job (a node's create with its dispatch and policy fields, then its
// terminal write) on a private redis-server, 256 jobs in flight through one
// writer; it runs only when TROUPE_REDIS_CPU_JOBS sets the number of jobs
// (a measurement for BENCHMARKS.md, not a test of behaviour):
//
//	TROUPE_REDIS_CPU_JOBS=30000 go test -count=1 -run TestHappyPathRedisCPU -v ./internal/store/
//
// TROUPE_REDIS_CPU_REQ_BYTES pads each job's request to that many bytes
// (the default, ~60, is shorter than a real request);
// TROUPE_REDIS_CPU_CONFIG="name value ..." is CONFIG SET on the server
// first (e.g. "hash-max-listpack-value 1024").
func TestHappyPathRedisCPU(t *testing.T) {
	jobs, _ := strconv.Atoi(os.Getenv("TROUPE_REDIS_CPU_JOBS"))
	if jobs <= 0 {
		t.Skip("TROUPE_REDIS_CPU_JOBS not set")
	}
	rdb := privateRedis(t)
	ctx := context.Background()
	if kv := strings.Fields(os.Getenv("TROUPE_REDIS_CPU_CONFIG")); len(kv) > 0 {
		if err := rdb.ConfigSet(ctx, kv[0], strings.Join(kv[1:], " ")).Err(); err != nil {
			t.Fatal(err)
		}
	}
	reqBytes, _ := strconv.Atoi(os.Getenv("TROUPE_REDIS_CPU_REQ_BYTES"))
	s := store.New(rdb, store.Config{Prefix: "cpu:", LockTTL: time.Minute})
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	w := s.NewWriter(0, 0, 0)
	t.Cleanup(w.Close)
	run := func(prefix string, n int) { runHappyPath(t, w, prefix, n, reqBytes) }
	run("warm-", jobs/10) // the scripts compiled, the sets grown
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	cpu0, in0 := redisCPU(t, rdb), netInput(t, rdb)
	start := time.Now()
	run("job-", jobs)
	cpu, in := redisCPU(t, rdb)-cpu0, netInput(t, rdb)-in0
	enc := "?"
	if keys, err := rdb.Keys(ctx, "cpu:*:job:job-1").Result(); err == nil && len(keys) == 1 {
		enc = rdb.ObjectEncoding(ctx, keys[0]).Val()
	}
	mem := ""
	if info, err := rdb.Info(ctx, "memory").Result(); err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				mem = v
			}
		}
	}
	calls := commandCalls(t, rdb)
	var total int64
	for name, n := range calls {
		switch name {
		case "info", "config|resetstat", "config", "ping", "hello", "client|setinfo", "client", "script|load", "script":
			continue
		}
		total += n
	}
	t.Logf("redis CPU %.1f µs per job (%.4f CPU-s per 1,000), %.2f server commands per job, %.0f request bytes per job, %d jobs in %s, records %s, used_memory %s",
		cpu/float64(jobs)*1e6, cpu/float64(jobs)*1e3, float64(total)/float64(jobs), float64(in)/float64(jobs), jobs,
		time.Since(start).Round(time.Millisecond), enc, mem)
}

// netInput is the bytes a redis-server has read from its clients
// (total_net_input_bytes).
func netInput(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_net_input_bytes:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// runHappyPath runs n jobs' happy path (the create straight into
// DISPATCHED, then SUCCEEDED) through the writer w, 256 jobs at a time, the
// ids prefix plus a number; a request of reqBytes (0: the minimal one).
func runHappyPath(t *testing.T, w *store.Writer, prefix string, n, reqBytes int) {
	const inFlight = 256
	var wg sync.WaitGroup
	ids := make(chan int)
	for g := 0; g < inFlight; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := make(chan *store.Result, 1)
			do := func(op *store.Op) *store.Result {
				op.Done = func(r *store.Result) { res <- r }
				w.Submit(op)
				r := <-res
				if r.Err != nil {
					t.Error(r.Err)
				}
				return r
			}
			for i := range ids {
				id := prefix + strconv.Itoa(i)
				req := "\n\x0f" + id + "\x12\tjob.bench\"\x1bredis://ctx:" + id
				if pad := reqBytes - len(req); pad > 0 {
					req += strings.Repeat("x", pad)
				}
				now := time.Now()
				dl := strconv.FormatInt(now.Add(150*time.Minute).UnixMilli(), 10)
				r := do(&store.Op{Kind: store.OpActivate, JobID: id, Node: "bench-node", Create: true,
					Topic: "job.bench", Tenant: "default", TraceID: id, Request: []byte(req),
					T: &store.Transition{Path: []store.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonAllowed},
						{To: jobstate.StateDispatched, Reason: jobstate.ReasonDispatched}},
						Due: now.Add(150 * time.Minute).UnixMilli(), Op: "10qb36hj69zb6",
						Fields: []string{"worker", "bw4", "subj", "bench-node.worker.bw4.jobs", "attempts", "1",
							"deadline", dl, "deadline_kind", "running_timeout", "sod", "1", "pool", "bench",
							"policy_decision", "allow", "policy_reason", "allow-all policy", "rule_id", "troupe:allow-all",
							"policy_snapshot", "allow-all"}}})
				if r.Status != store.ActivateCreated {
					t.Errorf("create %s: %+v", id, r)
					for range ids { // the rest unrun, the sender not left waiting
					}
					return
				}
				r = do(&store.Op{Kind: store.OpTransition, JobID: id, Node: "bench-node", LockValue: jobstate.LockValue("bench-node", r.Fence),
					T: &store.Transition{Expect: jobstate.Expect(jobstate.StateDispatched), Op: "3llbv2k2zgyx7",
						Path: []store.Hop{{To: jobstate.StateRunning, Reason: jobstate.ReasonStarted},
							{To: jobstate.StateSucceeded, Reason: jobstate.ReasonCompleted}},
						// What a node writes: the worker is the dispatch's, no time reported.
						Fields: []string{"result_ptr", "redis://res:" + id}}})
				if r.Step != store.StepOK {
					t.Errorf("finish %s: %+v", id, r)
					for range ids {
					}
					return
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		ids <- i
	}
	close(ids)
	wg.Wait()
}
