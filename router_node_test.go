package troupe_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// evictTTL is the worker TTL of the tests where a worker dies holding a
// job that must go to a survivor: short, so the dead worker is evicted
// quickly, yet twice the 1 s that made them fail 3 in 80 at load ~20: the
// survivor dropped its dispatch as stale (worker.StaleDispatch: 0.75 of
// the window after the beat it was stamped with, which a ~750 ms stall of
// the test process reaches) and, beating every second into a 1 s window,
// flapped between live and evicted.
const evictTTL = 2 * time.Second

// startSurvivor starts the worker that must take over a dead worker's
// job. It dedupes, so a dispatch it drops as stale after a stall of the
// test process is repeated until it arrives (the node's own answer to a
// dropped dispatch), not left to the dispatch timeout.
func startSurvivor(f *fixture, rec *receipts) {
	f.t.Helper()
	f.startWorkerWith("survivor", true, rec, worker.Echo, func(c *worker.Config) { c.Dedupe = true })
}

// redispatched matches a history that goes back to SCHEDULED for the lost
// worker and is dispatched again, with any waits between.
var redispatched = regexp.MustCompile(`SCHEDULED:worker_lost (SCHEDULED:[a-z_]+ )*DISPATCHED:dispatched`)

// A worker that takes a job and then dies (no more heartbeats, no result)
// before reporting its start costs the job a re-dispatch to another
// worker, not a dispatch timeout.
func TestEvictedWorkersJobsAreDispatchedElsewhere(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) { c.Tuning.WorkerTTL = evictTTL })
	got, die := f.doomedWorker("doomed")
	f.waitWorkers(1)
	f.submit(echoReq("job-orphan"))
	if id := <-got; id != "job-orphan" {
		t.Fatalf("doomed worker got %s", id)
	}
	die() // the worker dies holding the job
	rec := newReceipts()
	startSurvivor(f, rec)
	r := f.waitState("job-orphan", jobstate.StateSucceeded)
	// Re-placed after the loss; it may wait a moment (stale_worker,
	// no_workers) if the survivor's first heartbeat is not in yet.
	if !redispatched.MatchString(reasons(r.History)) || r.Worker != "survivor" {
		t.Fatalf("history %s worker %s", reasons(r.History), r.Worker)
	}
	if r.Fields["lost_worker"] != "doomed" {
		t.Fatalf("lost_worker %q", r.Fields["lost_worker"])
	}
}

// A worker that sends no progress (a stock CAP worker) and dies holding a
// job: the job counts as started on delivery, so it is not dispatched
// again (it may have run — on a pool subject, maybe on another worker); it
// ends by its running deadline, no other worker ever receives it, and its
// history says why (worker_lost_runner_unknown).
func TestStockCAPWorkerLostJobIsNotRunTwice(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.WorkerTTL = time.Second
		c.Tuning.Timeouts = &troupe.Timeouts{Dispatch: time.Minute, Running: 3 * time.Second}
	})
	dead := make(chan struct{})
	doomed := startCapWorker(t, f.env.NATS, f.subj, "doomed", 4, 100*time.Millisecond,
		func(string) bool { <-dead; return false })
	f.waitWorkers(1)
	f.submit(echoReq("job-stock"))
	doomed.waitGot(5 * time.Second)
	close(dead)    // it dies holding the job: no result, ever…
	doomed.close() // …and no more heartbeats: it is evicted within a second
	survivor := startCapWorker(t, f.env.NATS, f.subj, "survivor", 4, 100*time.Millisecond, nil)
	r := f.waitState("job-stock", jobstate.StateTimeout)
	// The history names what happened: the picked worker was lost, but no
	// worker had spoken for the job, so its deadline decided.
	h := reasons(r.History)
	if r.Reason != jobstate.ReasonRunningTimeout || strings.Contains(h, "SCHEDULED:worker_lost") ||
		!strings.Contains(h, "DISPATCHED:worker_lost_runner_unknown") {
		t.Fatalf("history %s", h)
	}
	if n := survivor.received.Load(); n != 0 {
		t.Fatalf("the survivor received %d jobs; job-stock must run at most once", n)
	}
	// An operator finds such jobs: a detail on the record, and a metric.
	if r.Fields["lost_detail"] == "" || counter(t, f.node, "troupe_jobs_runner_unknown_total", "") != 1 {
		t.Fatalf("lost_detail %q, troupe_jobs_runner_unknown_total %v; want a detail and 1", r.Fields["lost_detail"],
			counter(t, f.node, "troupe_jobs_runner_unknown_total", ""))
	}
}

// A topic mapping added at run time through Redis is used by the node.
func TestRuntimeTopicMapping(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "wn", Pool: "newpool", Topics: []string{"job.new"},
		Direct: true, SubjectPrefix: f.subj.Prefix(), Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	f.waitWorkers(1)
	if err := f.node.Mappings().Set(context.Background(), "job.new", "newpool"); err != nil {
		t.Fatal(err)
	}
	f.submit(&capv1.JobRequest{JobId: "job-mapped", Topic: "job.new"})
	r := f.waitState("job-mapped", jobstate.StateSucceeded)
	if r.Worker != "wn" {
		t.Fatalf("worker %s", r.Worker)
	}
}

// A tenant's concurrency cap holds across replicas: with a cap of 1 and two
// nodes sharing Redis, never more than one of its jobs is with a worker;
// the others wait with reason tenant_limit; another tenant is not held up.
func TestTenantLimitAcrossReplicas(t *testing.T) {
	t.Parallel()
	limits := map[string]int{"acme": 1}
	f := newFixture(t, func(c *troupe.Config) { c.Tuning.TenantLimits = limits })
	newNodeOn(t, f, "node-b", func(c *troupe.Config) { c.Tuning.TenantLimits = limits })
	var mu sync.Mutex
	holding, maxHolding := 0, 0
	release := make(chan struct{})
	f.startWorker("w1", true, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		if req.TenantId == "acme" {
			mu.Lock()
			holding++
			maxHolding = max(maxHolding, holding)
			mu.Unlock()
			<-release
			mu.Lock()
			holding--
			mu.Unlock()
		}
		return worker.Echo(ctx, req)
	})
	waitLive(t, f.node, 1)
	for i := 0; i < 3; i++ {
		req := echoReq(fmt.Sprintf("acme-%d", i))
		req.TenantId = "acme"
		f.submit(req)
	}
	other := echoReq("globex-1")
	other.TenantId = "globex"
	f.submit(other)
	f.waitState("globex-1", jobstate.StateSucceeded)
	// Two acme jobs wait for the cap, with the reason recorded.
	waiting := 0
	deadline := time.Now().Add(10 * time.Second)
	for waiting < 2 && time.Now().Before(deadline) {
		waiting = 0
		for i := 0; i < 3; i++ {
			if r, err := f.node.Record(context.Background(), fmt.Sprintf("acme-%d", i)); err == nil &&
				r.State == jobstate.StateScheduled && r.Reason == jobstate.ReasonTenantLimit {
				waiting++
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if waiting != 2 {
		t.Fatalf("%d acme jobs wait with tenant_limit, want 2", waiting)
	}
	close(release)
	for i := 0; i < 3; i++ {
		f.waitState(fmt.Sprintf("acme-%d", i), jobstate.StateSucceeded)
	}
	mu.Lock()
	defer mu.Unlock()
	if maxHolding != 1 {
		t.Fatalf("%d acme jobs were with the worker at once, cap is 1", maxHolding)
	}
	n, _ := f.env.Redis.ZCard(context.Background(), store.NewKeys(f.env.KeyPrefix()).TenantActive("acme")).Result()
	if n != 0 {
		t.Fatalf("%d tenant slots still held after every job finished", n)
	}
}

// A finished job stops counting against its worker at once, not at the
// worker's next heartbeat: a worker of max_parallel 2 beating every 5 s
// (the CAP SDK default) runs ten quick jobs in well under one interval.
func TestFinishedJobsFreeTheirWorkerBeforeTheNextHeartbeat(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "small", Pool: "echo", Topics: []string{"job.echo"},
		Direct: true, SubjectPrefix: f.subj.Prefix(), Heartbeat: 5 * time.Second, MaxParallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	f.waitWorkers(1)
	start := time.Now()
	for i := 0; i < 10; i++ {
		f.submit(echoReq(fmt.Sprintf("quick-%d", i)))
	}
	for i := 0; i < 10; i++ {
		f.waitStateWithin(fmt.Sprintf("quick-%d", i), jobstate.StateSucceeded, 4*time.Second)
	}
	if el := time.Since(start); el > 4*time.Second {
		t.Fatalf("ten quick jobs took %v: the worker stayed full until its heartbeat", el)
	}
}

// A worker dies while running a job it reported started (a direct dispatch,
// so Troupe knows where the job runs): the job is not run again (it may
// have run), and does not wait for its running deadline (hours) either: it
// ends FAILED worker_lost once WorkerLostGrace has passed since the
// worker's eviction, and its history says so (issue 20, item 7).
func TestStartedJobOfALostWorkerFailsAfterTheGrace(t *testing.T) {
	t.Parallel()
	t.Run("live", func(t *testing.T) { t.Parallel(); startedJobOfALostWorker(t, false) })
	// Parked in RUNNING (no actor): the eviction wakes it all the same.
	t.Run("parked", func(t *testing.T) { t.Parallel(); startedJobOfALostWorker(t, true) })
}

func startedJobOfALostWorker(t *testing.T, park bool) {
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.WorkerTTL = time.Second
		c.Tuning.WorkerLostGrace = time.Second
		if park {
			c.Tuning.ParkAfter = 100 * time.Millisecond
		} else {
			c.Tuning.ParkAfter = -1
		}
	})
	got, die := f.doomedWorker("doomed")
	f.waitWorkers(1)
	f.submit(echoReq("job-lost-running"))
	if id := <-got; id != "job-lost-running" {
		t.Fatalf("doomed worker got %s", id)
	}
	f.publishProgress("job-lost-running", "doomed")
	f.waitState("job-lost-running", jobstate.StateRunning)
	if park {
		waitParked(t, f.node, 1)
	}
	rec := newReceipts()
	f.startWorker("survivor", true, rec, worker.Echo)
	die() // the worker dies while running the job
	r := f.waitStateWithin("job-lost-running", jobstate.StateFailed, 20*time.Second)
	if r.Reason != jobstate.ReasonWorkerLost || !strings.Contains(reasons(r.History), "RUNNING:worker_lost FAILED:worker_lost") {
		t.Fatalf("reason %s, history %s", r.Reason, reasons(r.History))
	}
	if rec.count("job-lost-running") != 0 {
		t.Fatal("the started job was run again on the survivor")
	}
	f.waitDLQ(func(e store.DLQEntry) bool {
		return e.JobID == "job-lost-running" && e.Reason == jobstate.ReasonWorkerLost
	})
}

// doomedWorker is a direct-dispatch worker that reports progress: it
// heartbeats every 100 ms and passes the ids of the jobs it is sent to got;
// die stops its heartbeats (it holds whatever it got).
func (f *fixture) doomedWorker(id string) (got <-chan string, die func()) {
	f.t.Helper()
	nc := f.env.NATS
	jobs := make(chan string, 16)
	sub, err := nc.Subscribe(f.subj.Worker(id), func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetJobRequest() != nil {
			jobs <- p.GetJobRequest().JobId
		}
	})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = sub.Unsubscribe() })
	stop := make(chan struct{})
	go func() {
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			data, _ := bus.EncodeHeartbeat(id, &capv1.Heartbeat{WorkerId: id, Pool: "echo", MaxParallelJobs: 10,
				Labels: map[string]string{registry.LabelDispatch: registry.DispatchDirect,
					registry.LabelProgress: registry.ProgressStarted}})
			_ = nc.Publish(f.subj.Heartbeat, data)
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	}()
	var once sync.Once
	die = func() { once.Do(func() { close(stop) }) }
	f.t.Cleanup(die)
	return jobs, die
}

// On a pool subject NATS, not Troupe, chooses the receiver. The worker that
// speaks for the job (its progress names it as sender) is the job's worker
// from then on: the loss of the worker Troupe picked does not touch the
// job, the loss of the one running it does — FAILED worker_lost after the
// grace (issue 15, item 2).
func TestPoolSubjectJobIsChargedToTheWorkerThatSpoke(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.WorkerTTL = time.Second
		c.Tuning.WorkerLostGrace = time.Second
		c.Tuning.ParkAfter = -1
	})
	nc := f.env.NATS
	beating := func(id string) (stop func()) {
		done := make(chan struct{})
		go func() {
			tk := time.NewTicker(100 * time.Millisecond)
			defer tk.Stop()
			for {
				data, _ := bus.EncodeHeartbeat(id, &capv1.Heartbeat{WorkerId: id, Pool: "echo", MaxParallelJobs: 10,
					Labels: map[string]string{registry.LabelProgress: registry.ProgressStarted}})
				_ = nc.Publish(f.subj.Heartbeat, data)
				select {
				case <-done:
					return
				case <-tk.C:
				}
			}
		}()
		var once sync.Once
		stop = func() { once.Do(func() { close(done) }) }
		t.Cleanup(stop)
		return stop
	}
	// "picked" heartbeats but takes nothing from the pool subject; "runner"
	// takes the jobs there and heartbeats only once it has one.
	stopPicked := beating("picked")
	f.waitWorkers(1)
	got := make(chan string, 1)
	sub, err := nc.QueueSubscribe(f.subj.Pool("job.echo"), "echo", func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetJobRequest() != nil {
			got <- p.GetJobRequest().JobId
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	f.submit(echoReq("job-spoken-for"))
	if id := <-got; id != "job-spoken-for" {
		t.Fatalf("runner got %s", id)
	}
	stopRunner := beating("runner")
	f.waitWorkers(2)
	f.publishProgress("job-spoken-for", "runner")
	r := f.waitState("job-spoken-for", jobstate.StateRunning)
	if r.Worker != "runner" {
		t.Fatalf("job's worker %q after the runner spoke, want runner", r.Worker)
	}
	// The picked worker dies: nothing happens to the job.
	stopPicked()
	f.waitWorkers(1)
	r, err = f.node.Record(context.Background(), "job-spoken-for")
	if err != nil || r.State != jobstate.StateRunning || strings.Contains(reasons(r.History), "worker_lost") {
		t.Fatalf("after the picked worker's loss: %v %s %v", r.State, reasons(r.History), err)
	}
	// The runner dies: the job is lost with it.
	stopRunner()
	r = f.waitStateWithin("job-spoken-for", jobstate.StateFailed, 20*time.Second)
	if r.Reason != jobstate.ReasonWorkerLost || !strings.Contains(reasons(r.History), "RUNNING:worker_lost FAILED:worker_lost") {
		t.Fatalf("reason %s, history %s", r.Reason, reasons(r.History))
	}
}
