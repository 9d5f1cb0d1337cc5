package troupe_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// Tests of parked jobs: a DISPATCHED or RUNNING job whose actor stopped
// after Config.Tuning.ParkAfter, held by its node through the node lease.

// parkFast parks a job 50 ms after it reaches its worker and polls fast.
func parkFast(c *troupe.Config) {
	c.Tuning.ParkAfter = 50 * time.Millisecond
	c.Tuning.DuePoll = 50 * time.Millisecond
	c.Tuning.DueSlack = 50 * time.Millisecond
}

// gates hold each job's answer until the test opens its gate.
type gates struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

func (g *gates) gate(id string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.ch[id]
	if !ok {
		c = make(chan struct{})
		g.ch[id] = c
	}
	return c
}

func (g *gates) open(id string) { close(g.gate(id)) }

// holdingWorker starts a worker that takes jobs and answers each only when
// its gate is opened (or the test ends).
func (f *fixture) holdingWorker(id string, rec *receipts) *gates {
	f.t.Helper()
	g := &gates{ch: map[string]chan struct{}{}}
	done := make(chan struct{})
	f.t.Cleanup(func() { close(done) })
	// It announces that it reports starts (it never does, holding every
	// job unstarted), so a job's bound at it is the dispatch timeout.
	cfg := worker.Config{ID: id, Pool: "echo", Topics: []string{"job.echo"}, Direct: true, SubjectPrefix: f.subj.Prefix(),
		Heartbeat: time.Second, OnReceive: rec.hook,
		Labels: map[string]string{registry.LabelProgress: registry.ProgressStarted},
		Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
			select {
			case <-g.gate(req.JobId):
			case <-ctx.Done():
			case <-done:
			}
			return worker.Echo(ctx, req)
		}}
	w, err := worker.Start(f.env.NATS, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	f.waitWorkers(1)
	return g
}

// publishProgress publishes worker's RUNNING progress for job id, as a CAP
// worker does when it starts the job.
func (f *fixture) publishProgress(id, worker string) {
	f.t.Helper()
	data, err := bus.Encoder{}.Progress("trace-"+id, worker,
		&capv1.JobProgress{JobId: id, Status: capv1.JobStatus_JOB_STATUS_RUNNING})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.env.NATS.Publish(f.subj.Progress, data); err != nil {
		f.t.Fatal(err)
	}
}

// waitParked waits until node n has parked want jobs (its parked set in
// Redis) and has no live job actor left.
func waitParked(t *testing.T, n *troupe.Node, want int64) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		got, err := n.Store().ParkedCount(context.Background(), n.ID())
		live, _ := n.LiveJobActors()
		if err == nil && got == want && live == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	got, _ := n.Store().ParkedCount(context.Background(), n.ID())
	live, _ := n.LiveJobActors()
	t.Fatalf("node %s: %d jobs parked and %d actors live, want %d parked and none live", n.ID(), got, live, want)
}

func TestParkedJobCompletesWhenItsResultArrives(t *testing.T) {
	t.Parallel()
	f := newFixture(t, parkFast)
	rec := newReceipts()
	release := f.holdingWorker("w1", rec)
	f.submit(echoReq("job-park-ok"))
	<-rec.ch
	waitParked(t, f.node, 1)
	ctx := context.Background()
	lock := f.env.Redis.Get(ctx, store.NewKeys(f.env.KeyPrefix()).Lock("job-park-ok")).Val()
	if !strings.HasPrefix(lock, "node-a|") || !strings.HasSuffix(lock, "|p") {
		t.Fatalf("parked lock %q", lock)
	}
	release.open("job-park-ok")
	r := f.waitState("job-park-ok", jobstate.StateSucceeded)
	if last := r.History[len(r.History)-1]; last.Node != "node-a" || r.LockHolder != "" {
		t.Fatalf("finished by %s, lock %q", last.Node, r.LockHolder)
	}
	if n, _ := f.node.Store().ParkedCount(ctx, "node-a"); n != 0 {
		t.Fatalf("%d jobs still parked", n)
	}
	if got := counter(t, f.node, "troupe_jobs_unparked_total", ""); got != 1 {
		t.Fatalf("unparked %v", got)
	}
	if n := rec.count("job-park-ok"); n != 1 {
		t.Fatalf("received %d times", n)
	}
}

func TestParkedJobIsCancelled(t *testing.T) {
	t.Parallel()
	f := newFixture(t, parkFast)
	rec := newReceipts()
	release := f.holdingWorker("w1", rec)
	f.submit(echoReq("job-park-cancel"))
	<-rec.ch
	waitParked(t, f.node, 1)
	if err := f.node.Cancel(context.Background(), "job-park-cancel", "changed my mind", "tester"); err != nil {
		t.Fatal(err)
	}
	r := f.waitState("job-park-cancel", jobstate.StateCancelled)
	if r.Reason != jobstate.ReasonCancelRequested || r.LockHolder != "" {
		t.Fatalf("reason %s lock %q", r.Reason, r.LockHolder)
	}
	// The worker's late answer is absorbed.
	release.open("job-park-cancel")
	time.Sleep(200 * time.Millisecond)
	if r, _ := f.node.Record(context.Background(), "job-park-cancel"); r.State != jobstate.StateCancelled {
		t.Fatalf("state %s after the late result", r.State)
	}
}

func TestParkedJobsDeadlineFires(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		parkFast(c)
		c.Tuning.Timeouts = &troupe.Timeouts{Dispatch: time.Second, Running: time.Hour}
	})
	rec := newReceipts()
	f.holdingWorker("w1", rec) // never answers
	cancels := f.cancels()
	f.submit(echoReq("job-park-timeout"))
	<-rec.ch
	waitParked(t, f.node, 1)
	r := f.waitState("job-park-timeout", jobstate.StateTimeout)
	if r.Reason != jobstate.ReasonDispatchTimeout {
		t.Fatalf("reason %s", r.Reason)
	}
	select {
	case id := <-cancels:
		if id != "job-park-timeout" {
			t.Fatalf("cancel for %s", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the worker was not told to cancel the timed-out job")
	}
}

// Progress for a parked job is recorded, not dropped: the first progress
// moves it to RUNNING (and its deadline to the running timeout) on the node
// that parked it, and it parks again.
func TestParkedJobsProgressIsRecorded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, parkFast)
	rec := newReceipts()
	release := f.holdingWorker("w1", rec)
	f.submit(echoReq("job-park-progress"))
	<-rec.ch
	waitParked(t, f.node, 1)
	f.publishProgress("job-park-progress", "w1")
	r := f.waitState("job-park-progress", jobstate.StateRunning)
	if r.Reason != jobstate.ReasonStarted || r.Fields["deadline_kind"] != string(jobstate.ReasonRunningTimeout) {
		t.Fatalf("reason %s deadline kind %s", r.Reason, r.Fields["deadline_kind"])
	}
	waitParked(t, f.node, 1) // parked again, now RUNNING
	release.open("job-park-progress")
	f.waitState("job-park-progress", jobstate.StateSucceeded)
}

// A worker that dies holding a parked job it never started costs the job a
// re-dispatch, as for a live one: the router still knows the dispatch, and
// the shard spawns an actor for the parked job.
func TestParkedJobOfAnEvictedWorkerIsDispatchedElsewhere(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		parkFast(c)
		c.Tuning.WorkerTTL = evictTTL
	})
	got, die := f.doomedWorker("doomed")
	f.waitWorkers(1)
	f.submit(echoReq("job-park-evict"))
	if id := <-got; id != "job-park-evict" {
		t.Fatalf("doomed worker got %s", id)
	}
	waitParked(t, f.node, 1)
	die() // the worker dies holding the parked job
	rec := newReceipts()
	startSurvivor(f, rec)
	r := f.waitState("job-park-evict", jobstate.StateSucceeded)
	if !redispatched.MatchString(reasons(r.History)) || r.Worker != "survivor" {
		t.Fatalf("history %s worker %s", reasons(r.History), r.Worker)
	}
}

// A dead node's parked jobs (lock "<node>|<fence>|p", its lease expired) are
// adopted by the due poller of a live node, which then applies the worker's
// late result.
func TestDeadNodesParkedJobsAreAdopted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, parkFast)
	ctx := context.Background()
	keys := store.NewKeys(f.env.KeyPrefix())
	// What node "ghost", killed, left behind: a parked DISPATCHED job, its
	// parked-set entry, and a node lease renewed long ago (no alive keys).
	req, _ := proto.Marshal(echoReq("parked-orphan"))
	deadline := time.Now().Add(time.Hour).UnixMilli()
	f.env.Redis.HSet(ctx, keys.Job("parked-orphan"), "s", "DISPATCHED", "fence", 4, "topic", "job.echo", "req", req,
		"worker", "w-gone", "subj", f.subj.Worker("w-gone"), "deadline", deadline, "deadline_kind", "dispatch_timeout",
		"created", time.Now().UnixMilli(), "node", "ghost")
	f.env.Redis.Set(ctx, keys.Lock("parked-orphan"), "ghost|4|p", 0)
	f.env.Redis.ZAdd(ctx, keys.Parked(store.Shard("parked-orphan"), "ghost"), redis.Z{Score: float64(deadline), Member: "parked-orphan"})
	f.env.Redis.ZAdd(ctx, keys.Nodes(), redis.Z{Score: float64(time.Now().Add(-time.Hour).UnixMilli()), Member: "ghost"})
	waitDeadline := time.Now().Add(10 * time.Second)
	for {
		if holder := f.env.Redis.Get(ctx, keys.Lock("parked-orphan")).Val(); strings.HasPrefix(holder, "node-a|") {
			break
		}
		if time.Now().After(waitDeadline) {
			t.Fatal("the dead node's parked job was never adopted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := waitCounter(t, f.node, "troupe_orphan_replayed_total", "job.echo", 1); got < 1 {
		t.Fatalf("adoption not counted: %v", got)
	}
	res, _ := bus.EncodeResult("parked-orphan", "w-gone", &capv1.JobResult{JobId: "parked-orphan", WorkerId: "w-gone",
		Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED})
	f.publishRaw(f.subj.Result, res)
	r := f.waitState("parked-orphan", jobstate.StateSucceeded)
	// Fence 4 was the dead node's; the adoption took 5, and the adopted
	// job may park again before the result comes (parkFast), which takes
	// one more activation.
	if last := r.History[len(r.History)-1]; last.Node != "node-a" || r.Fence < 5 {
		t.Fatalf("finished by %s with fence %d", last.Node, r.Fence)
	}
	// Once its last parked job is adopted, the dead node is forgotten.
	for waitDeadline = time.Now().Add(10 * time.Second); ; {
		if f.env.Redis.ZScore(ctx, keys.Nodes(), "ghost").Err() == redis.Nil {
			break
		}
		if time.Now().After(waitDeadline) {
			sc, _ := f.env.Redis.ZScore(ctx, keys.Nodes(), "ghost").Result()
			n, _ := f.node.Store().ParkedCount(ctx, "ghost")
			t.Fatalf("dead node never forgotten: score %v, parked %d", sc, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A node stopped gracefully gives its lease up, so another replica adopts
// its parked jobs at once, not a lock TTL later.
func TestGracefulStopHandsParkedJobsOver(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		parkFast(c)
		c.Tuning.LockTTL = time.Hour // adoption must not wait for it
	})
	rec := newReceipts()
	release := f.holdingWorker("w1", rec)
	for _, id := range []string{"job-park-h1", "job-park-h2"} {
		f.submit(echoReq(id))
		<-rec.ch
	}
	waitParked(t, f.node, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.node.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	b := newNodeOn(t, f, "node-b", parkFast, func(c *troupe.Config) { c.Tuning.LockTTL = time.Hour })
	waitParked(t, b, 2) // adopted, then parked again on b
	for _, id := range []string{"job-park-h1", "job-park-h2"} {
		release.open(id)
		r := f.waitState(id, jobstate.StateSucceeded)
		if last := r.History[len(r.History)-1]; last.Node != "node-b" {
			t.Fatalf("%s finished by %s", id, last.Node)
		}
		if n := rec.count(id); n != 1 {
			t.Fatalf("%s received %d times", id, n)
		}
	}
}

// A node restarted under the same id still holds the jobs its earlier run
// parked (its lease is renewed under the same name); it must learn them
// again, or their worker's progress would be dropped.
func TestRestartedNodeRemembersItsParkedJobs(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		parkFast(c)
		c.Tuning.LockTTL = time.Hour
	})
	rec := newReceipts()
	release := f.holdingWorker("w1", rec)
	f.submit(echoReq("job-park-restart"))
	<-rec.ch
	waitParked(t, f.node, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.node.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	again := newNodeOn(t, f, "node-a", parkFast, func(c *troupe.Config) { c.Tuning.LockTTL = time.Hour })
	waitParked(t, again, 1)
	// The new process learns its parked jobs in the background: wait until
	// a shard remembers this one.
	deadline := time.Now().Add(10 * time.Second)
	for n, _ := again.ParkedInMemory(); n < 1; n, _ = again.ParkedInMemory() {
		if time.Now().After(deadline) {
			t.Fatal("the restarted node never remembered its parked job")
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.publishProgress("job-park-restart", "w1")
	f.waitState("job-park-restart", jobstate.StateRunning)
	release.open("job-park-restart")
	f.waitState("job-park-restart", jobstate.StateSucceeded)
}

// argString is a Redis command's argument as text: the store passes a
// script's keys as *string (no allocation per key).
func argString(a any) string {
	if p, ok := a.(*string); ok {
		return *p
	}
	return fmt.Sprint(a)
}

// holdPark holds the pipeline that parks job id until proceed is closed,
// after telling parking.
type holdPark struct {
	id      string
	once    sync.Once
	parking chan struct{}
	proceed chan struct{}
}

func (h *holdPark) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *holdPark) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *holdPark) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			args := c.Args()
			if len(args) < 6 || args[0] != "evalsha" || !strings.HasSuffix(argString(args[3]), h.id) {
				continue
			}
			parks := false
			for _, a := range args[4:8] {
				parks = parks || strings.Contains(argString(a), "parked:")
			}
			if parks {
				h.once.Do(func() {
					close(h.parking)
					select {
					case <-h.proceed:
					case <-time.After(10 * time.Second):
					}
				})
			}
		}
		return next(ctx, cmds)
	}
}

// A progress that reaches the job's actor while it is parking the job is not
// lost: the job's next actor records it.
func TestProgressWhileParkingIsRecorded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	_ = f.node.Stop(context.Background())
	hook := &holdPark{id: "job-park-race", parking: make(chan struct{}), proceed: make(chan struct{})}
	rdb := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(f.env.RedisURL, "redis://")})
	rdb.AddHook(hook)
	t.Cleanup(func() { _ = rdb.Close() })
	n := newNodeOn(t, f, "node-p", parkFast, func(c *troupe.Config) { c.Redis = rdb })
	rec := newReceipts()
	release := f.holdingWorker("w1", rec)
	f.submit(echoReq("job-park-race"))
	<-rec.ch
	select {
	case <-hook.parking:
	case <-time.After(10 * time.Second):
		t.Fatal("the job never started parking")
	}
	f.publishProgress("job-park-race", "w1")
	// The progress must be in the parking actor's mailbox before the park
	// completes; nothing observable says so, so give it a moment.
	time.Sleep(200 * time.Millisecond)
	close(hook.proceed)
	r := f.waitState("job-park-race", jobstate.StateRunning)
	if r.Reason != jobstate.ReasonStarted {
		t.Fatalf("RUNNING for %s", r.Reason)
	}
	waitParked(t, n, 1) // parked again, RUNNING
	release.open("job-park-race")
	f.waitState("job-park-race", jobstate.StateSucceeded)
}

// Redis loses its data (here: every key of this test's prefix) while a job
// is parked: the node sees the epoch key vanish, and the worker's result for
// the job whose record is gone is dead-lettered as state_lost, not as an
// unknown job.
func TestResultOfAJobRedisLostIsDeadLetteredAsStateLost(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		parkFast(c)
		c.Tuning.LockTTL = 1500 * time.Millisecond // the lease, and the epoch check, every 0.5 s
	})
	rec := newReceipts()
	release := f.holdingWorker("w1", rec)
	f.submit(echoReq("job-redis-lost"))
	<-rec.ch
	waitParked(t, f.node, 1)
	ctx := context.Background()
	keys, err := f.env.Redis.Keys(ctx, f.env.KeyPrefix()+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys of the test: %v %v", keys, err)
	}
	for _, k := range keys { // one by one: they span hash slots
		f.env.Redis.Del(ctx, k)
	}
	if got := waitCounter(t, f.node, "troupe_redis_data_loss_total", "", 1); got != 1 {
		t.Fatalf("data loss seen %v times, want once", got)
	}
	release.open("job-redis-lost")
	e := f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == "job-redis-lost" })
	if e.Reason != jobstate.ReasonStateLost {
		t.Fatalf("dead-lettered as %s (%s), want %s", e.Reason, e.Message, jobstate.ReasonStateLost)
	}
}
