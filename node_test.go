package troupe_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/intake"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// fixture is one test's node plus helpers.
type fixture struct {
	t    *testing.T
	env  *testenv.Env
	node *troupe.Node
	subj bus.Subjects
	js   jetstream.JetStream
	// beat is startWorker's heartbeat interval (workerBeat).
	beat time.Duration
}

// workerBeat is the heartbeat interval of the fixture's workers under a
// node whose worker TTL is ttl: 1 s, or a tenth of a shorter TTL. A worker
// beating once per window is stale for the last quarter of every interval:
// `troupe worker` drops a dispatch that reaches it 0.75 window after the
// beat its node stamped it with (worker.StaleDispatch), and the node evicts
// it whenever a beat arrives late. At a tenth, only a stall of 0.65 window
// of the worker's own heartbeats or of the dispatch's path does that.
func workerBeat(ttl time.Duration) time.Duration {
	if ttl > 0 && ttl/10 < time.Second {
		return ttl / 10
	}
	return time.Second
}

const testPools = `
topics:
  job.echo: echo
  job.strict: strict
pools:
  echo: {requires: []}
  strict: {requires: [gpu]}
`

func parseTestPools() (*troupe.Pools, error) { return troupe.ParsePools([]byte(testPools)) }

// quietLogger keeps test output to errors.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

func newFixture(t *testing.T, mutate func(*troupe.Config)) *fixture {
	t.Helper()
	return newFixtureIn(t, testenv.New(t), mutate)
}

// newFixtureIn is newFixture in env (say, one with a private NATS server).
func newFixtureIn(t *testing.T, env *testenv.Env, mutate func(*troupe.Config)) *fixture {
	t.Helper()
	pools, err := parseTestPools()
	if err != nil {
		t.Fatal(err)
	}
	cfg := troupe.Config{
		NodeID: "node-a", NATSURL: env.NATSURL, RedisURL: env.RedisURL,
		KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(),
		Pools: pools, Logger: quietLogger(),
	}
	troupe.SetBackoff(&cfg, func(int) time.Duration { return 50 * time.Millisecond })
	if mutate != nil {
		mutate(&cfg)
	}
	node, err := troupe.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	js, _ := jetstream.New(env.NATS)
	return &fixture{t: t, env: env, node: node, subj: node.Subjects(), js: js, beat: workerBeat(cfg.Tuning.WorkerTTL)}
}

// receipts counts job receipts per job id across workers.
type receipts struct {
	mu   sync.Mutex
	n    map[string]int
	subj map[string]string
	ch   chan string
}

func newReceipts() *receipts {
	return &receipts{n: map[string]int{}, subj: map[string]string{}, ch: make(chan string, 10000)}
}

func (r *receipts) hook(subject string, req *capv1.JobRequest) {
	r.mu.Lock()
	r.n[req.JobId]++
	r.subj[req.JobId] = subject
	r.mu.Unlock()
	r.ch <- req.JobId
}

func (r *receipts) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[id]
}

func (f *fixture) startWorker(id string, direct bool, rec *receipts, h worker.Handler) *worker.Worker {
	f.t.Helper()
	return f.startWorkerWith(id, direct, rec, h, nil)
}

// startWorkerWith is startWorker with mutate applied to the worker's config.
func (f *fixture) startWorkerWith(id string, direct bool, rec *receipts, h worker.Handler,
	mutate func(*worker.Config)) *worker.Worker {
	f.t.Helper()
	cfg := worker.Config{ID: id, Pool: "echo", Topics: []string{"job.echo"}, Direct: direct,
		SubjectPrefix: f.subj.Prefix(), Handler: h, Heartbeat: f.beat}
	if rec != nil {
		cfg.OnReceive = rec.hook
	}
	if mutate != nil {
		mutate(&cfg)
	}
	w, err := worker.Start(f.env.NATS, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	f.waitWorkers(1)
	return w
}

// waitWorkers waits until the router has seen n live workers.
func (f *fixture) waitWorkers(n int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ws, err := f.node.Workers()
		if err == nil && len(ws) >= n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.t.Fatalf("router never saw %d workers", n)
}

func (f *fixture) submit(req *capv1.JobRequest) {
	f.t.Helper()
	data, err := bus.EncodeRequest("trace-"+req.JobId, "test-client", req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.publishRaw(f.subj.Submit, data)
}

func (f *fixture) publishRaw(subject string, data []byte) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := f.js.Publish(ctx, subject, data); err != nil {
		f.t.Fatal(err)
	}
}

// waitState polls the job record until it reaches want (bounded).
func (f *fixture) waitState(id string, want jobstate.State) *store.JobRecord {
	f.t.Helper()
	return f.waitStateWithin(id, want, 15*time.Second)
}

// waitRecordWithin waits, at most within, until job id has a record (any
// state): a node has taken its submit.
func (f *fixture) waitRecordWithin(id string, within time.Duration) {
	f.t.Helper()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := f.node.Record(context.Background(), id); err == nil {
			return
		}
	}
	f.t.Fatalf("job %s: no record within %v", id, within)
}

// waitStateWithin is waitState with its own bound.
func (f *fixture) waitStateWithin(id string, want jobstate.State, within time.Duration) *store.JobRecord {
	f.t.Helper()
	deadline := time.Now().Add(within)
	var last *store.JobRecord
	for time.Now().Before(deadline) {
		rec, err := f.node.Record(context.Background(), id)
		if err == nil {
			last = rec
			if rec.State == want {
				return rec
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if last != nil {
		f.t.Fatalf("job %s: state %s (reason %s), want %s; history %+v", id, last.State, last.Reason, want, last.History)
	}
	f.t.Fatalf("job %s: no record, want %s", id, want)
	return nil
}

// waitDLQ polls the DLQ until an entry matches (bounded).
func (f *fixture) waitDLQ(match func(store.DLQEntry) bool) store.DLQEntry {
	f.t.Helper()
	return f.waitDLQWithin(match, 15*time.Second)
}

func (f *fixture) waitDLQWithin(match func(store.DLQEntry) bool, within time.Duration) store.DLQEntry {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		es, err := f.node.Store().ListDLQ(context.Background(), 100)
		if err == nil {
			for _, e := range es {
				if match(e) {
					return e
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.t.Fatal("no matching DLQ entry")
	return store.DLQEntry{}
}

func states(h []store.HistoryEntry) []jobstate.State {
	out := make([]jobstate.State, len(h))
	for i, e := range h {
		out[i] = e.To
	}
	return out
}

func echoReq(id string) *capv1.JobRequest {
	return &capv1.JobRequest{JobId: id, Topic: "job.echo", ContextPtr: "redis://ctx:" + id}
}

func TestJobPathReachesSucceededThroughEveryState(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	rec := newReceipts()
	f.startWorker("w1", true, rec, worker.Echo)

	f.submit(echoReq("job-1"))
	r := f.waitState("job-1", jobstate.StateSucceeded)

	want := []jobstate.State{jobstate.StatePending, jobstate.StateScheduled, jobstate.StateDispatched, jobstate.StateRunning, jobstate.StateSucceeded}
	if got := states(r.History); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("history %v, want %v", got, want)
	}
	for i := 1; i < len(r.History); i++ {
		if r.History[i].At.Before(r.History[i-1].At) || r.History[i].Node != "node-a" {
			t.Fatalf("history entry %d out of order or wrong node: %+v", i, r.History[i])
		}
	}
	if r.Worker != "w1" || r.ResultPtr != "redis://ctx:job-1" {
		t.Fatalf("record worker=%q result_ptr=%q", r.Worker, r.ResultPtr)
	}
	if r.Subject != f.subj.Worker("w1") {
		t.Fatalf("direct-dispatch worker got the job on %q, want its direct subject", r.Subject)
	}
	if r.LockHolder != "" {
		t.Fatalf("lock still held after SUCCEEDED: %q", r.LockHolder)
	}
	if r.TraceID != "trace-job-1" {
		t.Fatalf("trace id %q not kept", r.TraceID)
	}
	if n := rec.count("job-1"); n != 1 {
		t.Fatalf("worker received job %d times", n)
	}
	mfs, _ := f.node.Metrics().Gather()
	observed := uint64(0)
	for _, mf := range mfs {
		if mf.GetName() == "troupe_dispatch_latency_seconds" {
			observed = mf.Metric[0].GetHistogram().GetSampleCount()
		}
	}
	if observed != 1 {
		t.Fatalf("dispatch latency observed %d times, want 1", observed)
	}
}

func TestStockWorkerGetsJobsOnThePoolSubject(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	rec := newReceipts()
	f.startWorker("stock-1", false, rec, worker.Echo)

	f.submit(echoReq("job-stock"))
	r := f.waitState("job-stock", jobstate.StateSucceeded)
	if r.Subject != f.subj.Pool("job.echo") {
		t.Fatalf("dispatched on %q, want pool subject %q", r.Subject, f.subj.Pool("job.echo"))
	}
	rec.mu.Lock()
	got := rec.subj["job-stock"]
	rec.mu.Unlock()
	if got != f.subj.Pool("job.echo") {
		t.Fatalf("stock worker received on %q", got)
	}
}

func TestDuplicateSubmitOfLiveJobChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	rec := newReceipts()
	release := make(chan struct{})
	f.startWorker("w1", true, rec, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return worker.Echo(ctx, req)
	})

	f.submit(echoReq("job-dup"))
	<-rec.ch // the worker holds the job
	f.waitState("job-dup", jobstate.StateDispatched)
	f.submit(echoReq("job-dup"))
	f.submit(echoReq("job-dup"))
	// A marker job submitted after the duplicates: once it has been
	// dispatched, the duplicates ahead of it in the stream were handled.
	f.submit(echoReq("job-marker"))
	<-rec.ch
	close(release)
	r := f.waitState("job-dup", jobstate.StateSucceeded)
	if n := rec.count("job-dup"); n != 1 {
		t.Fatalf("duplicate submits dispatched the job %d times", n)
	}
	pending := 0
	for _, h := range r.History {
		if h.To == jobstate.StatePending {
			pending++
		}
	}
	if pending != 1 || len(r.History) != 5 {
		t.Fatalf("history changed by duplicates: %v", states(r.History))
	}
	// Duplicates after the end are absorbed too.
	f.submit(echoReq("job-dup"))
	f.submit(echoReq("job-marker2"))
	<-rec.ch
	f.waitState("job-marker2", jobstate.StateSucceeded)
	if n := rec.count("job-dup"); n != 1 {
		t.Fatalf("submit after SUCCEEDED dispatched again (%d receipts)", n)
	}
}

func TestNoWorkersRetriesUntilAWorkerAppears(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.submit(echoReq("job-wait"))
	r := f.waitState("job-wait", jobstate.StateScheduled)
	if r.Reason != jobstate.ReasonNoWorkers {
		t.Fatalf("reason %q, want %q", r.Reason, jobstate.ReasonNoWorkers)
	}
	f.startWorker("late", true, nil, worker.Echo)
	r = f.waitState("job-wait", jobstate.StateSucceeded)
	if r.Attempts < 2 {
		t.Fatalf("attempts %d, want ≥ 2 (one failed placement, one dispatch)", r.Attempts)
	}
}

func TestPermanentRoutingErrorFailsAfterGraceWithDLQ(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) { c.Tuning.PermanentGrace = 200 * time.Millisecond })
	f.submit(&capv1.JobRequest{JobId: "job-unmapped", Topic: "job.nowhere"})
	f.submit(&capv1.JobRequest{JobId: "job-requires", Topic: "job.strict", Meta: &capv1.JobMetadata{Requires: []string{"tpu"}}})
	r := f.waitState("job-unmapped", jobstate.StateFailed)
	if r.Reason != jobstate.ReasonTopicUnmapped || r.ErrorCode != string(jobstate.ReasonTopicUnmapped) {
		t.Fatalf("reason %q error_code %q", r.Reason, r.ErrorCode)
	}
	f.waitDLQ(func(e store.DLQEntry) bool {
		return e.JobID == "job-unmapped" && e.Reason == jobstate.ReasonTopicUnmapped
	})
	r = f.waitState("job-requires", jobstate.StateFailed)
	if r.Reason != jobstate.ReasonRequiresUnsatisfied {
		t.Fatalf("reason %q", r.Reason)
	}
}

func TestMaxSchedulingRetriesKeepsTheLastReason(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.MaxSchedulingAttempts = 3
		troupe.SetBackoff(c, func(int) time.Duration { return time.Millisecond })
	})
	f.submit(echoReq("job-giveup"))
	r := f.waitState("job-giveup", jobstate.StateFailed)
	if r.Reason != jobstate.ReasonMaxSchedulingRetries {
		t.Fatalf("reason %q", r.Reason)
	}
	e := f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == "job-giveup" })
	if e.Reason != jobstate.ReasonMaxSchedulingRetries || e.LastReason != jobstate.ReasonNoWorkers {
		t.Fatalf("dlq entry reason %q last %q", e.Reason, e.LastReason)
	}
}

func TestBadInputIsDeadLetteredAndTheNodeKeepsWorking(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) { c.Tuning.UnknownHold = -1 })
	dlqSub, err := f.env.NATS.SubscribeSync(f.subj.DLQ)
	if err != nil {
		t.Fatal(err)
	}
	f.startWorker("w1", true, nil, worker.Echo)

	f.publishRaw(f.subj.Submit, []byte{0xff, 0xff, 0xff, 0x01})
	f.submit(&capv1.JobRequest{JobId: "no-topic"})
	f.submit(&capv1.JobRequest{Topic: "job.echo"})
	f.submit(&capv1.JobRequest{JobId: "bad id*>", Topic: "job.echo"})
	tooMany := map[string]string{}
	for i := 0; i <= intake.MaxLabels; i++ {
		tooMany[fmt.Sprintf("l%d", i)] = "v"
	}
	f.submit(&capv1.JobRequest{JobId: "too-many-labels", Topic: "job.echo", Labels: tooMany})
	hb, _ := bus.EncodeHeartbeat("x", &capv1.Heartbeat{WorkerId: "x"})
	f.publishRaw(f.subj.Submit, hb)
	res, _ := bus.EncodeResult("", "w9", &capv1.JobResult{JobId: "never-submitted", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED})
	f.publishRaw(f.subj.Result, res)
	f.publishRaw(f.subj.Result, []byte("not a packet at all"))

	f.waitDLQ(func(e store.DLQEntry) bool {
		return e.Reason == jobstate.ReasonDecodeFailed && e.Subject == f.subj.Submit
	})
	f.waitDLQ(func(e store.DLQEntry) bool { return e.Reason == jobstate.ReasonInvalidRequest && e.JobID == "no-topic" })
	f.waitDLQ(func(e store.DLQEntry) bool { return e.Reason == jobstate.ReasonInvalidRequest && e.JobID == "" })
	f.waitDLQ(func(e store.DLQEntry) bool { return e.Reason == jobstate.ReasonInvalidRequest && e.JobID == "bad id*>" })
	f.waitDLQ(func(e store.DLQEntry) bool {
		return e.Reason == jobstate.ReasonInvalidRequest && e.JobID == "too-many-labels" && strings.Contains(e.Message, "labels")
	})
	f.waitDLQ(func(e store.DLQEntry) bool { return e.Reason == jobstate.ReasonUnexpectedKind })
	f.waitDLQ(func(e store.DLQEntry) bool {
		return e.Reason == jobstate.ReasonUnknownJob && e.JobID == "never-submitted"
	})
	f.waitDLQ(func(e store.DLQEntry) bool {
		return e.Reason == jobstate.ReasonDecodeFailed && e.Subject == f.subj.Result
	})

	// Each rejection was announced on sys.job.dlq as a CAP JobResult.
	seen := map[string]bool{}
	for len(seen) < 4 {
		m, err := dlqSub.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("dlq packets seen %v: %v", seen, err)
		}
		p, err := bus.Decode(m.Data)
		if err != nil || p.GetJobResult() == nil || p.GetJobResult().Status != capv1.JobStatus_JOB_STATUS_FAILED {
			t.Fatalf("dlq packet is not a failed JobResult: %v", err)
		}
		seen[p.GetJobResult().ErrorCode] = true
	}

	// Nothing is left un-acked (no redelivery loop), and good jobs still flow.
	f.submit(echoReq("job-after-garbage"))
	f.waitState("job-after-garbage", jobstate.StateSucceeded)
	for _, kind := range []bus.StreamKind{bus.StreamSubmit, bus.StreamResult} {
		waitNoPending(t, f.js, bus.StreamName(f.env.StreamPrefix(), kind), bus.ConsumerName(kind))
	}
}

// waitNoPending waits until the consumer has nothing un-acked or undelivered.
func waitNoPending(t *testing.T, js jetstream.JetStream, stream, consumer string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var info *jetstream.ConsumerInfo
	for time.Now().Before(deadline) {
		c, err := js.Consumer(context.Background(), stream, consumer)
		if err == nil {
			info, err = c.Info(context.Background())
			if err == nil && info.NumAckPending == 0 && info.NumPending == 0 {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s/%s still has pending messages: %+v", stream, consumer, info)
}

func TestWorkerFailureIsRecorded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.startWorker("w1", true, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED, ErrorCode: "boom", ErrorMessage: "it broke"}
	})
	f.submit(echoReq("job-fails"))
	r := f.waitState("job-fails", jobstate.StateFailed)
	if r.Reason != jobstate.ReasonWorkerFailed || r.ErrorCode != "boom" || r.ErrorMessage != "it broke" {
		t.Fatalf("record %+v", r)
	}
}

func TestProgressMovesDispatchedToRunning(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	release := make(chan struct{})
	cfg := worker.Config{ID: "wp", Pool: "echo", Topics: []string{"job.echo"}, Direct: true, SubjectPrefix: f.subj.Prefix(),
		Progress: true, Heartbeat: time.Second,
		Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
			<-release
			return worker.Echo(ctx, req)
		}}
	w, err := worker.Start(f.env.NATS, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	f.waitWorkers(1)
	f.submit(echoReq("job-progress"))
	f.waitState("job-progress", jobstate.StateRunning)
	close(release)
	r := f.waitState("job-progress", jobstate.StateSucceeded)
	if r.History[3].Reason != jobstate.ReasonStarted {
		t.Fatalf("RUNNING entry reason %q", r.History[3].Reason)
	}
}

// Raw protobuf decoding is checked in proto/capv1; this asserts the node
// keeps the caller's request intact in the record it stores.
func TestStoredRequestRoundTrips(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.startWorker("w1", true, nil, worker.Echo)
	req := echoReq("job-rt")
	req.Labels = map[string]string{"run_id": "r1"} // not a placement label
	req.Env = map[string]string{"K": "V"}
	req.Budget = &capv1.Budget{DeadlineMs: 1234}
	f.submit(req)
	r := f.waitState("job-rt", jobstate.StateSucceeded)
	got := &capv1.JobRequest{}
	if err := proto.Unmarshal(r.Request, got); err != nil || !proto.Equal(got, req) {
		t.Fatalf("stored request differs: %v / %v", got, err)
	}
}

var _ = nats.DefaultURL

// startAdmin serves node's admin API on a loopback port for the test's
// life, with keys (API key → tenant; none: no auth), and returns its
// address.
func startAdmin(t *testing.T, node *troupe.Node, keys map[string]string) string {
	t.Helper()
	srv, err := admin.NewServer(admin.Config{Node: inspect.Of(node), Registry: node.Metrics(), Listen: "127.0.0.1:0",
		Log: quietLogger(), APIKeys: keys})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	return "http://" + srv.Addr()
}
