package faults_test

// Troupe past one machine: a 3-master Redis Cluster, and a 3-server NATS
// cluster with R3 streams losing a server to kill -9.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/internal/testhook"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/worker"
)

// slotErrors is a go-redis hook that records every command error a cluster
// client hands back to Troupe which says a command or script crossed slots
// or reached the wrong node (CROSSSLOT, MOVED/ASK not followed, a script's
// undeclared key in another slot, a cross-slot WATCH or MULTI).
type slotErrors struct {
	mu      sync.Mutex
	slot    int
	other   int
	samples []string
}

var slotErrorMarks = []string{"CROSSSLOT", "MOVED", "ASK ", "TRYAGAIN", "CLUSTERDOWN", "non local key",
	"same slot", "cross slot", "crossslot"}

func (h *slotErrors) see(cmd redis.Cmder) {
	err := cmd.Err()
	if err == nil || errors.Is(err, redis.Nil) {
		return
	}
	msg := err.Error()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range slotErrorMarks {
		if strings.Contains(msg, m) {
			h.slot++
			if len(h.samples) < 10 {
				h.samples = append(h.samples, cmd.Name()+": "+msg)
			}
			return
		}
	}
	if !strings.HasPrefix(msg, "NOSCRIPT") {
		h.other++
	}
}

func (h *slotErrors) counts() (slot, other int, samples []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.slot, h.other, slices.Clone(h.samples)
}

func (h *slotErrors) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *slotErrors) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.see(cmd)
		return err
	}
}

func (h *slotErrors) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.see(c)
		}
		return err
	}
}

// clusterClient is a client of the Redis Cluster at addrs. Routing policies
// are off, so a multi-key command across slots fails here instead of being
// split by the client: Troupe's code must not depend on that.
func clusterClient(t *testing.T, addrs []string, hook *slotErrors) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DisableRoutingPolicies: true})
	c.AddHook(hook)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

const clusterPools = `
topics:
  job.echo: default
  job.hang: default
  job.approve: default
  job.fatal: default
  job.undo: default
`

// clusterLogger is the nodes' logger: silent, or warnings and errors on
// stderr with TROUPE_CLUSTER_LOG=1 (to see what a fault did).
func clusterLogger() *slog.Logger {
	if os.Getenv("TROUPE_CLUSTER_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// clusterWorker handles every cluster-test topic: echo, approve and undo
// succeed at once, fatal fails (FAILED_FATAL, a saga step's failure), hang
// waits until cancelled. It counts receipts per job.
type clusterWorker struct {
	mu       sync.Mutex
	receipts map[string]int
	repeats  int // repeated deliveries the workers deduped
}

func (w *clusterWorker) start(t *testing.T, nc *nats.Conn, id string, subj bus.Subjects) {
	t.Helper()
	w.mu.Lock()
	if w.receipts == nil {
		w.receipts = map[string]int{}
	}
	w.mu.Unlock()
	wk, err := worker.Start(nc, worker.Config{ID: id, Pool: "default", Direct: true, SubjectPrefix: subj.Prefix(),
		Topics:    []string{"job.echo", "job.hang", "job.approve", "job.fatal", "job.undo"},
		Heartbeat: 500 * time.Millisecond, MaxParallel: 2000, Progress: true, Dedupe: true,
		OnReceive:   func(_ string, req *capv1.JobRequest) { w.mu.Lock(); w.receipts[req.JobId]++; w.mu.Unlock() },
		OnDuplicate: func(string, *capv1.JobRequest) { w.mu.Lock(); w.repeats++; w.mu.Unlock() },
		Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
			switch req.Topic {
			case "job.hang":
				<-ctx.Done()
				return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_CANCELLED}
			case "job.fatal":
				return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED_FATAL, ErrorCode: "boom"}
			}
			return worker.Echo(ctx, req)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wk.Stop)
}

// twice counts jobs received more than once.
func (w *clusterWorker) twice() (n int, ids []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, c := range w.receipts {
		if c > 1 {
			n++
			if len(ids) < 10 {
				ids = append(ids, id)
			}
		}
	}
	return n, ids
}

func clusterWaitWorkers(t *testing.T, node *troupe.Node, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if ws, err := inspect.Of(node).Workers(); err == nil && len(ws) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s never saw %d workers", node.ID(), n)
		}
	}
}

// clusterWaitState polls a job until it is terminal (or has state want, for a
// non-terminal wait), bounded by within; it fails the test with the job's
// history otherwise.
func clusterWaitState(t *testing.T, st *store.Store, id string, want jobstate.State, within time.Duration) *store.JobRecord {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	var last *store.JobRecord
	var lastErr error
	for {
		r, err := st.GetJob(ctx, id)
		if err == nil {
			last = r
			if r.State == want || (r.State.Terminal() && want.Terminal()) {
				if r.State != want {
					t.Fatalf("job %s ended %s (%s), want %s; history %+v", id, r.State, r.Reason, want, r.History)
				}
				return r
			}
		}
		lastErr = err
		if time.Now().After(deadline) {
			if last != nil {
				t.Fatalf("job %s: %s (%s), want %s; history %+v", id, last.State, last.Reason, want, last.History)
			}
			t.Fatalf("job %s: no record (%v), want %s", id, lastErr, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRedisCluster runs two nodes against a 3-master Redis Cluster (child
// processes) with a workload that touches every kind of key: 200 jobs
// over five tenants with limits, 40 pairs sharing an idempotency key, jobs
// that time out, are cancelled, need approval (granted or refused), a saga
// that rolls back, a DLQ retry, listings and the tenant-slot repair. Every
// job must reach its expected terminal state and no command may fail for
// crossing slots. Then the store package's tests run against the cluster.
func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node Redis Cluster")
	}
	rc := startRedisCluster(t)
	env := testenv.New(t) // NATS, and unique prefixes
	hook := &slotErrors{}
	pools, err := troupe.ParsePools([]byte(clusterPools))
	if err != nil {
		t.Fatal(err)
	}
	tenants := map[string]int{}
	for i := 0; i < 5; i++ {
		tenants[fmt.Sprintf("t%d", i)] = 1000
	}
	var nodes []*troupe.Node
	for _, id := range []string{"rc-a", "rc-b"} {
		cfg := troupe.Config{NodeID: id, NATSURL: env.NATSURL, Redis: clusterClient(t, rc.addrs, hook),
			KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(), Pools: pools,
			Policy: safety.TopicRules{Approve: []string{"job.approve"}},
			Tuning: troupe.Tuning{TenantLimits: tenants,
				Timeouts: &troupe.Timeouts{Dispatch: time.Minute, Running: time.Minute},
				SagaPoll: 100 * time.Millisecond, DuePoll: 200 * time.Millisecond, JobTrace: true},
			Logger: clusterLogger()}
		testhook.SetBackoff(&cfg, func(int) time.Duration { return 100 * time.Millisecond })
		n, err := troupe.NewNode(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = n.Start(ctx)
		cancel()
		if err != nil {
			t.Fatalf("start %s on the cluster: %v", id, err)
		}
		t.Cleanup(func() { _ = n.Stop(context.Background()) })
		nodes = append(nodes, n)
	}
	a := nodes[0]
	st := inspect.Of(a).Store()
	subj := inspect.Of(a).Subjects()
	var w clusterWorker
	w.start(t, env.NATS, "rc-w1", subj)
	for _, n := range nodes {
		clusterWaitWorkers(t, n, 1)
	}
	ctx := context.Background()
	submit := func(req *capv1.JobRequest) {
		t.Helper()
		if err := nodes[len(req.JobId)%2].Submit(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]jobstate.State{}

	for i := 0; i < 200; i++ {
		id := fmt.Sprintf("rc-echo-%d", i)
		submit(&capv1.JobRequest{JobId: id, Topic: "job.echo", TenantId: fmt.Sprintf("t%d", i%5)})
		want[id] = jobstate.StateSucceeded
	}
	var idem [][2]string
	for i := 0; i < 40; i++ {
		pair := [2]string{fmt.Sprintf("rc-idem-%d-a", i), fmt.Sprintf("rc-idem-%d-b", i)}
		for _, id := range pair {
			submit(&capv1.JobRequest{JobId: id, Topic: "job.echo", TenantId: "t1",
				Meta: &capv1.JobMetadata{IdempotencyKey: fmt.Sprintf("key-%d", i)}})
		}
		idem = append(idem, pair)
	}
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("rc-timeout-%d", i)
		submit(&capv1.JobRequest{JobId: id, Topic: "job.hang", Budget: &capv1.Budget{DeadlineMs: 1500}})
		want[id] = jobstate.StateTimeout
	}
	var cancels []string
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("rc-cancel-%d", i)
		submit(&capv1.JobRequest{JobId: id, Topic: "job.hang"})
		want[id], cancels = jobstate.StateCancelled, append(cancels, id)
	}
	var approvals []string
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("rc-approve-%d", i)
		submit(&capv1.JobRequest{JobId: id, Topic: "job.approve"})
		approvals = append(approvals, id)
		if want[id] = jobstate.StateSucceeded; i >= 3 {
			want[id] = jobstate.StateDenied
		}
	}
	// A saga: step 0 succeeds with a compensation, step 1 fails fatally,
	// and a node rolls the workflow back by running the compensation.
	s0 := &capv1.JobRequest{JobId: "rc-wf-s0", Topic: "job.echo", WorkflowId: "rc-wf", StepIndex: 0,
		Compensation: &capv1.Compensation{Topic: "job.undo", Capability: "undo"}}
	submit(s0)
	clusterWaitState(t, st, s0.JobId, jobstate.StateSucceeded, 30*time.Second)
	submit(&capv1.JobRequest{JobId: "rc-wf-s1", Topic: "job.fatal", WorkflowId: "rc-wf", StepIndex: 1})
	want["rc-wf-s1"] = jobstate.StateFailed

	for _, id := range cancels {
		clusterWaitRunning(t, st, id)
		if err := nodes[1].Cancel(ctx, id, "test", "cluster-test"); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range approvals {
		clusterWaitState(t, st, id, jobstate.StateApprovalRequired, 30*time.Second)
		d := troupe.DecisionApproved
		if i >= 3 {
			d = troupe.DecisionRejected
		}
		if err := nodes[i%2].Decide(ctx, id, d, "alice", "cluster test", ""); err != nil {
			t.Fatalf("decide %s: %v", id, err)
		}
	}
	for id, s := range want {
		clusterWaitState(t, st, id, s, 60*time.Second)
	}
	for _, pair := range idem {
		created := 0
		for _, id := range pair {
			r, err := st.GetJob(ctx, id)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			created++
			clusterWaitState(t, st, r.ID, jobstate.StateSucceeded, 30*time.Second)
		}
		if created != 1 {
			t.Fatalf("idempotency pair %v: %d jobs created, want 1", pair, created)
		}
	}
	prog := clusterWaitSaga(t, st, "rc-wf")
	if prog.Status != saga.StatusCompleted {
		t.Fatalf("saga rc-wf rolled back with status %s", prog.Status)
	}
	if rep, err := inspect.Of(nodes[1]).Saga(ctx, "rc-wf"); err != nil || rep == nil {
		t.Fatalf("saga report: %+v %v", rep, err)
	}
	// Runtime topic mappings: a change and its version bump are one MULTI
	// on the {routing} slot.
	if err := inspect.Of(a).Mappings().Set(ctx, "job.extra", "default"); err != nil {
		t.Fatalf("set mapping: %v", err)
	}
	if m, err := inspect.Of(nodes[1]).Mappings().Load(ctx); err != nil || m.Version < 1 || len(m.Topics["job.extra"]) != 1 {
		t.Fatalf("load mappings: %+v %v", m, err)
	}
	if err := inspect.Of(a).Mappings().Delete(ctx, "job.extra"); err != nil {
		t.Fatalf("delete mapping: %v", err)
	}

	// A DLQ entry (a refused approval's) is retried once as a new job,
	// which waits for approval again, and then deleted.
	retried := clusterDLQRetry(t, a, "rc-approve-3")
	clusterWaitState(t, st, retried, jobstate.StateApprovalRequired, 30*time.Second)

	// Listings and counts read every shard across the three masters.
	page, err := inspect.Of(a).ListJobs(ctx, store.ListQuery{State: jobstate.StateSucceeded, Limit: store.ListLimitMax})
	if err != nil {
		t.Fatal(err)
	}
	if got, min := len(page.Jobs), 200+40+3; got < min {
		t.Fatalf("listed %d SUCCEEDED jobs, want at least %d", got, min)
	}
	counts, err := inspect.Of(a).CountStates(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// The tenant-slot repair finds stale slots of tenants whose keys live on
	// every master.
	for i := 0; i < 30; i++ {
		k := st.Keys().TenantActive(fmt.Sprintf("repair-%d", i))
		if err := st.Client().ZAdd(ctx, k, redis.Z{Score: 1, Member: "no-such-job"}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := st.Client().SAdd(ctx, st.Keys().Tenants(), k).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := st.RepairTenantSlots(ctx, 0, 100); err != nil || n < 30 {
		t.Fatalf("tenant slot repair removed %d stale slots (err %v), want at least 30", n, err)
	}

	if n, ids := w.twice(); n != 0 {
		t.Fatalf("%d jobs reached the worker twice: %v", n, ids)
	}
	slot, other, samples := hook.counts()
	if slot != 0 {
		t.Fatalf("%d Redis commands failed for crossing slots or nodes: %v", slot, samples)
	}
	records := int64(0)
	for _, n := range counts {
		records += n
	}
	t.Logf("Redis Cluster (3 masters): %d job records (+ 40 idempotent duplicates never created), all in their expected "+
		"state; saga %s; by state %v; 0 slot errors, %d other command errors", records, prog.Status, counts, other)

	t.Run("store package tests", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "github.com/troupe-run/troupe/internal/store")
		cmd.Env = append(os.Environ(), "TROUPE_TEST_REDIS_CLUSTER="+strings.Join(rc.addrs, ","))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("store tests against the Redis Cluster: %v\n%s", err, out)
		}
		t.Logf("store tests against the Redis Cluster: %s", strings.TrimSpace(string(out)))
	})
}

// clusterWaitRunning waits until the worker has the job (DISPATCHED or RUNNING).
func clusterWaitRunning(t *testing.T, st *store.Store, id string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if r, err := st.GetJob(context.Background(), id); err == nil && (r.State == jobstate.StateRunning) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s never reached RUNNING", id)
		}
	}
}

// clusterWaitSaga waits until the workflow's rollback has an outcome.
func clusterWaitSaga(t *testing.T, st *store.Store, wf string) *saga.Progress {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		p, err := saga.ReadProgress(context.Background(), st, wf)
		if err == nil && p.Status != "" && p.Status != saga.StatusRunning {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("saga %s has no outcome: %+v %v", wf, p, err)
		}
	}
}

// clusterDLQRetry finds jobID's DLQ entry, retries it (a second retry is refused),
// reads the retry mark back and deletes the entry; it returns the new job.
func clusterDLQRetry(t *testing.T, n *troupe.Node, jobID string) string {
	t.Helper()
	ctx := context.Background()
	var entry *store.DLQEntry
	for deadline := time.Now().Add(20 * time.Second); entry == nil; time.Sleep(20 * time.Millisecond) {
		es, err := inspect.Of(n).ListDLQ(ctx, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for i := range es {
			if es[i].JobID == jobID {
				entry = &es[i]
			}
		}
		if entry == nil && time.Now().After(deadline) {
			t.Fatalf("no DLQ entry for %s", jobID)
		}
	}
	newID, err := inspect.Of(n).RetryDLQ(ctx, entry.ID, false)
	if err != nil {
		t.Fatalf("retry DLQ entry of %s: %v", jobID, err)
	}
	if _, err := inspect.Of(n).RetryDLQ(ctx, entry.ID, false); !errors.Is(err, store.ErrAlreadyRetried) {
		t.Fatalf("second retry of the DLQ entry: %v, want ErrAlreadyRetried", err)
	}
	marks, err := inspect.Of(n).DLQRetried(ctx, []string{entry.ID, "1-1"})
	if err != nil || marks[entry.ID] != newID {
		t.Fatalf("retry marks %v (err %v), want %s → %s", marks, err, entry.ID, newID)
	}
	if l, err := inspect.Of(n).JobLinks(ctx, jobID); err != nil || len(l.Retries) != 1 || l.Retries[0] != newID {
		t.Fatalf("links of %s: %+v (err %v)", jobID, l, err)
	}
	if err := inspect.Of(n).DeleteDLQ(ctx, entry.ID); err != nil {
		t.Fatalf("delete DLQ entry: %v", err)
	}
	return newID
}

// TestNATSClusterR3 runs two nodes and two workers against a 3-server NATS
// cluster (child processes) with the node's streams at 3 replicas, submits
// 2,000 jobs at 100/s, and kill -9s one server (the SUBMIT stream's leader,
// or TROUPE_NATS_KILL=meta|result|worker to pick the meta leader, the RESULT
// leader or the server a worker is connected to) 6 s
// in. Every acknowledged job must reach SUCCEEDED, none may reach a worker
// twice; the stall (largest gap between successive completions) and the
// throughput after the kill are logged.
func TestNATSClusterR3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-server NATS cluster")
	}
	ncl := startNATSCluster(t, 3)
	env := testenv.New(t) // Redis, and unique prefixes
	pools, err := troupe.ParsePools([]byte(clusterPools))
	if err != nil {
		t.Fatal(err)
	}
	connect := func(name string) *nats.Conn {
		t.Helper()
		c, err := nats.Connect(ncl.urls(), nats.Name(name), nats.MaxReconnects(-1),
			nats.ReconnectWait(250*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	conns := map[string]*nats.Conn{}
	var nodes []*troupe.Node
	for _, id := range []string{"r3-a", "r3-b"} {
		nc := connect(id)
		conns[id] = nc
		// Deadlines past JetStream's redelivery of a batch lost with a
		// dead connection (AckWait, 30 s), so only a lost dispatch times out.
		// A young cluster under a loaded CI machine sometimes takes long to
		// place a replicated stream or consumer: a start that times out is
		// tried again (creating streams and consumers is idempotent).
		var n *troupe.Node
		for attempt := 1; ; attempt++ {
			var err error
			cfg := troupe.Config{NodeID: id, NATS: nc, Redis: env.Client,
				Tuning: troupe.Tuning{StreamReplicas: 3,
					Timeouts: &troupe.Timeouts{Dispatch: 45 * time.Second, Running: 45 * time.Second}},
				KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(), Pools: pools,
				Logger: clusterLogger()}
			testhook.SetBackoff(&cfg, func(int) time.Duration { return 100 * time.Millisecond })
			n, err = troupe.NewNode(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err = n.Start(ctx)
			cancel()
			if err == nil {
				break
			}
			_ = n.Stop(context.Background())
			if attempt == 3 {
				t.Fatalf("start %s: %v (3 attempts)", id, err)
			}
			t.Logf("start %s, attempt %d: %v; trying again", id, attempt, err)
		}
		t.Cleanup(func() { _ = n.Stop(context.Background()) })
		nodes = append(nodes, n)
	}
	subj := inspect.Of(nodes[0]).Subjects()
	var w clusterWorker
	for _, id := range []string{"r3-w1", "r3-w2"} {
		conns[id] = connect(id)
		w.start(t, conns[id], id, subj)
	}
	for _, n := range nodes {
		clusterWaitWorkers(t, n, 2)
	}
	pub := connect("r3-submitter")
	conns["submitter"] = pub
	js, err := jetstream.New(pub)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	leaders := map[string]string{}
	for _, k := range []bus.StreamKind{bus.StreamSubmit, bus.StreamResult, bus.StreamCancel} {
		s, err := js.Stream(ctx, bus.StreamName(env.StreamPrefix(), k))
		if err != nil {
			t.Fatal(err)
		}
		info := s.CachedInfo()
		if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Fatalf("stream %s: replicas %d, cluster %+v; want R3", info.Config.Name, info.Config.Replicas, info.Cluster)
		}
		leaders[string(k)] = info.Cluster.Leader
	}
	meta, err := ncl.metaLeader()
	if err != nil || meta == "" {
		t.Fatalf("meta leader: %q %v", meta, err)
	}
	victimName := leaders[string(bus.StreamSubmit)]
	switch os.Getenv("TROUPE_NATS_KILL") {
	case "meta":
		victimName = meta
	case "result":
		victimName = leaders[string(bus.StreamResult)]
	case "worker":
		victimName = conns["r3-w1"].ConnectedServerName()
	}
	victim := ncl.byName(victimName)
	if victim == nil {
		t.Fatalf("no server named %q", victimName)
	}
	var roles []string
	if victimName == meta {
		roles = append(roles, "meta leader")
	}
	for k, l := range leaders {
		if l == victimName {
			roles = append(roles, k+" leader")
		}
	}
	var attached []string
	for name, c := range conns {
		if c.ConnectedServerName() == victimName {
			attached = append(attached, name)
		}
	}
	sort.Strings(attached)

	const (
		rate   = 100
		total  = 2000
		killAt = 6 * time.Second
	)
	var (
		ids       []string
		acked     = map[string]time.Time{}
		retries   atomic.Int64
		submitted = make(chan struct{})
	)
	start := time.Now()
	go func() {
		defer close(submitted)
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		for i := 0; i < total; i++ {
			<-tick.C
			id := fmt.Sprintf("r3-%d", i)
			data, _ := bus.EncodeRequest(id, "cluster-test", &capv1.JobRequest{JobId: id, Topic: "job.echo"})
			// A client retries an unacknowledged publish; the message id
			// lets the stream drop a copy that did land.
			for try := 0; try < 200; try++ {
				pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := js.Publish(pctx, subj.Submit, data, jetstream.WithMsgID(id))
				cancel()
				if err == nil {
					break
				}
				retries.Add(1)
				time.Sleep(100 * time.Millisecond)
			}
			ids = append(ids, id)
			acked[id] = time.Now()
		}
	}()
	time.Sleep(killAt)
	victim.kill9()
	killed := time.Now()
	t.Logf("killed %s (%s; clients attached: %v)", victimName, strings.Join(roles, ", "), attached)
	elected := make(chan map[string]time.Duration, 1)
	go func() { elected <- waitNewLeaders(ctx, js, env.StreamPrefix(), victimName, killed) }()
	<-submitted
	submitEnd := time.Now()

	st := inspect.Of(nodes[0]).Store()
	done := map[string]time.Time{}        // SUCCEEDED jobs → when
	failed := map[string]jobstate.State{} // other terminal states
	deadline := time.Now().Add(120 * time.Second)
	for len(done)+len(failed) < len(ids) && time.Now().Before(deadline) {
		pipe := st.Client().Pipeline()
		cmds := map[string]*redis.SliceCmd{}
		for _, id := range ids {
			_, ok := done[id]
			if _, bad := failed[id]; !ok && !bad {
				cmds[id] = pipe.HMGet(ctx, st.Keys().Job(id), "s", "updated")
			}
		}
		_, _ = pipe.Exec(ctx)
		for id, c := range cmds {
			v := c.Val()
			if len(v) != 2 {
				continue
			}
			s, _ := v[0].(string)
			switch state := jobstate.State(s); {
			case state == jobstate.StateSucceeded:
				ms, _ := v[1].(string)
				var at int64
				fmt.Sscan(ms, &at)
				done[id] = time.UnixMilli(at)
			case state.Terminal():
				failed[id] = state
			}
		}
		if len(done)+len(failed) < len(ids) {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if len(done)+len(failed) < len(ids) {
		byState := map[string]int{}
		var sample []string
		for _, id := range ids {
			_, ok := done[id]
			if _, bad := failed[id]; ok || bad {
				continue
			}
			r, err := st.GetJob(ctx, id)
			s := "no record"
			if err == nil {
				s = string(r.State) + "/" + string(r.Reason)
				if len(sample) < 3 {
					sample = append(sample, fmt.Sprintf("%s %+v", id, r.History))
				}
			}
			byState[s]++
		}
		t.Fatalf("%d of %d jobs not terminal 120 s after the last submit: %v; e.g. %v", len(ids)-len(done)-len(failed),
			len(ids), byState, sample)
	}
	// A dispatch (or the worker's progress) made as the server died is lost
	// with the dead connection; the workers dedupe, so the node repeats the
	// dispatch until the job shows it arrived. Every job must succeed.
	for id, state := range failed {
		r, err := st.GetJob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		w.mu.Lock()
		got := w.receipts[id]
		w.mu.Unlock()
		t.Errorf("job %s ended %s (%s), run by a worker %d times; history %+v", id, state, r.Reason, got, r.History)
	}
	times := make([]time.Time, 0, len(done))
	for _, at := range done {
		times = append(times, at)
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	var gap time.Duration
	var gapAt time.Time
	for i := 1; i < len(times); i++ {
		if d := times[i].Sub(times[i-1]); d > gap {
			gap, gapAt = d, times[i-1]
		}
	}
	after := 0
	perSec := make([]int, 16) // completions in each second from 1 s before the kill
	for _, at := range times {
		if !at.Before(killed) && at.Before(killed.Add(10*time.Second)) {
			after++
		}
		if i := int(at.Sub(killed.Add(-time.Second)) / time.Second); at.After(killed.Add(-time.Second)) && i < len(perSec) {
			perSec[i]++
		}
	}
	// How long a job waited between its submit's acknowledgement and its
	// completion: the node-side stall, apart from the stream's own.
	var worstWait time.Duration
	var worstJob string
	for id, at := range done {
		if d := at.Sub(acked[id]); d > worstWait {
			worstWait, worstJob = d, id
		}
	}
	var ackGap time.Duration
	ackTimes := make([]time.Time, 0, len(acked))
	for _, at := range acked {
		ackTimes = append(ackTimes, at)
	}
	sort.Slice(ackTimes, func(i, j int) bool { return ackTimes[i].Before(ackTimes[j]) })
	for i := 1; i < len(ackTimes); i++ {
		ackGap = max(ackGap, ackTimes[i].Sub(ackTimes[i-1]))
	}
	t.Logf("new leaders after the kill: %v; longest gap between submit acks %v; longest submit-ack → SUCCEEDED %v (%s)",
		<-elected, ackGap.Round(time.Millisecond), worstWait.Round(time.Millisecond), worstJob)
	twice, twiceIDs := w.twice()
	w.mu.Lock()
	repeats := w.repeats
	w.mu.Unlock()
	t.Logf("NATS cluster R3, kill -9 of %s (%s; clients attached: %v) %v into %d jobs at %d/s: %d SUCCEEDED, "+
		"%d not SUCCEEDED, %d run twice, %d repeated deliveries deduped; longest gap between completions %v (starting %v after the kill); "+
		"%.1f jobs/s completed in the 10 s after the kill (per second from 1 s before: %v); last completion %v after the last submit; %d publish retries",
		victimName, strings.Join(roles, ", "), attached, killed.Sub(start).Round(time.Millisecond), total, rate,
		len(done), len(failed), twice, repeats,
		gap.Round(time.Millisecond), gapAt.Sub(killed).Round(time.Millisecond), float64(after)/10, perSec,
		times[len(times)-1].Sub(submitEnd).Round(time.Millisecond), retries.Load())
	if twice != 0 {
		t.Fatalf("%d jobs reached a worker twice: %v", twice, twiceIDs)
	}
}

// waitNewLeaders polls (bounded, 60 s) until every stream and consumer of
// the test has a leader other than the killed server, and returns how long
// after the kill each was first seen led elsewhere.
func waitNewLeaders(ctx context.Context, js jetstream.JetStream, prefix, dead string, killed time.Time) map[string]time.Duration {
	out := map[string]time.Duration{}
	kinds := []bus.StreamKind{bus.StreamSubmit, bus.StreamResult, bus.StreamCancel}
	for deadline := killed.Add(60 * time.Second); len(out) < 2*len(kinds) && time.Now().Before(deadline); {
		for _, k := range kinds {
			name := bus.StreamName(prefix, k)
			if _, ok := out["stream "+string(k)]; !ok {
				rctx, cancel := context.WithTimeout(ctx, time.Second)
				if s, err := js.Stream(rctx, name); err == nil {
					if c := s.CachedInfo().Cluster; c != nil && c.Leader != "" && c.Leader != dead {
						out["stream "+string(k)] = time.Since(killed).Round(10 * time.Millisecond)
					}
				}
				cancel()
			}
			if _, ok := out["consumer "+string(k)]; !ok {
				rctx, cancel := context.WithTimeout(ctx, time.Second)
				if c, err := js.Consumer(rctx, name, bus.ConsumerName(k)); err == nil {
					if cl := c.CachedInfo().Cluster; cl != nil && cl.Leader != "" && cl.Leader != dead {
						out["consumer "+string(k)] = time.Since(killed).Round(10 * time.Millisecond)
					}
				}
				cancel()
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return out
}
