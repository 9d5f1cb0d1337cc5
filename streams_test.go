package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// The processed-message guard must not take a message of a recreated
// stream for one it handled before: the new stream's sequences start at 1
// again. Results of a first batch of jobs are handled (and marked); the
// RESULT stream is deleted and recreated; a second batch's results get the
// same sequences. The test takes a share of their first deliveries and
// never acks them (a node that died holding them), so JetStream offers
// them again to the running node: each must be handled.
func TestGuardSurvivesARecreatedStream(t *testing.T) {
	t.Parallel()
	// The test recreates the stream itself (as an operator would); the
	// node's own recreation is TestFaultStreamDeletedWhileRunning's.
	f := newFixtureIn(t, testenv.NewWithPrivateNATS(t), func(c *troupe.Config) { c.Tuning.StreamCheck = -1 })
	f.startWorker("w1", true, nil, worker.Echo)
	ctx := context.Background()
	resultStream := bus.StreamName(f.env.StreamPrefix(), bus.StreamResult)
	consumer := bus.ConsumerName(bus.StreamResult)

	const n = 40
	for i := 0; i < n; i++ {
		f.submit(echoReq(fmt.Sprintf("before-%d", i)))
	}
	for i := 0; i < n; i++ {
		f.waitState(fmt.Sprintf("before-%d", i), jobstate.StateSucceeded)
	}
	waitNoPending(t, f.js, resultStream, consumer) // every result acked: marked 1..n

	if err := f.js.DeleteStream(ctx, resultStream); err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, f.js, f.env.StreamPrefix(), f.subj); err != nil {
		t.Fatal(err)
	}
	cons, err := f.js.Consumer(ctx, resultStream, consumer)
	if err != nil {
		t.Fatal(err)
	}
	// The pull is open before the results exist, so it competes with the
	// node's for their first deliveries; it closes before any redelivery
	// (5 s after the first) could reach it.
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		f.submit(echoReq(fmt.Sprintf("after-%d", i)))
	}
	stolen := 0
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if md.Sequence.Stream > n {
			t.Fatalf("sequence %d: the recreated stream's sequences should repeat 1..%d", md.Sequence.Stream, n)
		}
		stolen++ // never acked
	}
	if stolen == 0 {
		t.Fatal("the test's pull got no first delivery; nothing was redelivered")
	}
	t.Logf("%d of %d results redelivered to the node", stolen, n)
	for i := 0; i < n; i++ {
		f.waitStateWithin(fmt.Sprintf("after-%d", i), jobstate.StateSucceeded, 30*time.Second)
	}
	if got := counter(t, f.node, "troupe_redeliveries_skipped_total", resultStream); got != 0 {
		t.Fatalf("the guard skipped %v redelivered results of the recreated stream", got)
	}
}

// A running node recreates its RESULT and SUBMIT streams when they are
// deleted under it (an operator's mistake, a lost JetStream store): it
// counts each, and jobs submitted afterwards run to the end.
func TestFaultStreamDeletedWhileRunning(t *testing.T) {
	t.Parallel()
	f := newFixtureIn(t, testenv.NewWithPrivateNATS(t), nil)
	f.startWorker("w1", true, nil, worker.Echo)
	ctx := context.Background()
	f.submit(echoReq("before"))
	f.waitState("before", jobstate.StateSucceeded)

	names := map[bus.StreamKind]string{}
	deleted := time.Now()
	for _, kind := range []bus.StreamKind{bus.StreamResult, bus.StreamSubmit} {
		names[kind] = bus.StreamName(f.env.StreamPrefix(), kind)
		if err := f.js.DeleteStream(ctx, names[kind]); err != nil {
			t.Fatal(err)
		}
	}
	// The node finds both missing (a fetch fails, or its periodic check)
	// and recreates them.
	deadline := time.Now().Add(3 * bus.StreamCheckEvery)
	for _, name := range names {
		for counter(t, f.node, "troupe_streams_recreated_total", name) < 1 {
			if time.Now().After(deadline) {
				t.Fatalf("stream %s not recreated within %v", name, 3*bus.StreamCheckEvery)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	recreated := time.Since(deleted)
	if err := f.node.Ready(ctx); err != nil {
		t.Fatalf("not ready after the streams were recreated: %v", err)
	}

	const n = 50
	for i := 0; i < n; i++ {
		f.submit(echoReq(fmt.Sprintf("after-%d", i)))
	}
	for i := 0; i < n; i++ {
		f.waitStateWithin(fmt.Sprintf("after-%d", i), jobstate.StateSucceeded, 20*time.Second)
	}
	for kind, name := range names {
		if got := counter(t, f.node, "troupe_streams_recreated_total", name); got != 1 {
			t.Fatalf("%s recreated %v times, want 1", name, got)
		}
		waitNoPending(t, f.js, name, bus.ConsumerName(kind))
	}
	t.Logf("both streams recreated %v after their deletion; %d jobs submitted then all SUCCEEDED", recreated.Round(time.Millisecond), n)
}

// streamLossWorker is a hand-written CAP worker on raw NATS that announces
// direct dispatch and dedupe: on a job's first delivery it says RUNNING and
// finishes the job, but its result is "lost with the result stream" (never
// published); on a repeat of a finished job it sends the result, as
// `troupe worker --dedupe` does.
type streamLossWorker struct {
	mu         sync.Mutex
	deliveries map[string]int
}

func startStreamLossWorker(t *testing.T, f *fixture, id string) *streamLossWorker {
	t.Helper()
	sw := &streamLossWorker{deliveries: map[string]int{}}
	nc := f.env.NATS
	sub, err := nc.Subscribe(f.subj.Worker(id), func(m *nats.Msg) {
		pkt, err := bus.Decode(m.Data)
		if err != nil || pkt.GetJobRequest() == nil {
			return
		}
		req := pkt.GetJobRequest()
		sw.mu.Lock()
		sw.deliveries[req.JobId]++
		first := sw.deliveries[req.JobId] == 1
		sw.mu.Unlock()
		if first {
			if data, err := (bus.Encoder{}).Progress(pkt.TraceId, id, &capv1.JobProgress{JobId: req.JobId,
				Status: capv1.JobStatus_JOB_STATUS_RUNNING}); err == nil {
				_ = nc.Publish(f.subj.Progress, data)
			}
			return
		}
		data, err := bus.EncodeResult(pkt.TraceId, id, &capv1.JobResult{JobId: req.JobId, WorkerId: id,
			Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: req.ContextPtr})
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = f.js.Publish(ctx, f.subj.Result, data)
			cancel()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	f.heartbeatAs(t, id, map[string]string{registry.LabelDispatch: registry.DispatchDirect,
		registry.LabelDedupe: registry.DedupeJobID, registry.LabelProgress: registry.ProgressStarted})
	return sw
}

func (sw *streamLossWorker) delivered(id string) int {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return sw.deliveries[id]
}

// A result stream that is deleted (or lost with a JetStream store) takes
// the results it held with it. The node that finds the new stream tells
// every job it owns that is with its worker — live, or parked here — and
// those on deduping workers repeat their dispatch; the worker answers a
// repeat of a finished job with its result again. Both jobs end SUCCEEDED
// long before their running deadline (issue 20, item 5).
func TestResultStreamLossAsksDedupingWorkersAgain(t *testing.T) {
	t.Parallel()
	f := newFixtureIn(t, testenv.NewWithPrivateNATS(t), func(c *troupe.Config) {
		fastResend(c)
		c.Tuning.ParkAfter = 2 * time.Second
		c.Tuning.StreamCheck = 200 * time.Millisecond
	})
	sw := startStreamLossWorker(t, f, "forgetful")
	f.submit(echoReq("sl-parked"))
	f.waitState("sl-parked", jobstate.StateRunning)
	waitParked(t, f.node, 1)
	f.submit(echoReq("sl-live"))
	f.waitState("sl-live", jobstate.StateRunning)

	name := bus.StreamName(f.env.StreamPrefix(), bus.StreamResult)
	if err := f.js.DeleteStream(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"sl-parked", "sl-live"} {
		rec := f.waitStateWithin(id, jobstate.StateSucceeded, 20*time.Second)
		if n := sw.delivered(id); n < 2 {
			t.Fatalf("%s: delivered %d times, want its dispatch repeated after the stream loss", id, n)
		}
		if rec.Attempts != 1 {
			t.Errorf("%s: %d scheduling attempts, want 1 (a repeat is the same dispatch)", id, rec.Attempts)
		}
	}
	if got := counter(t, f.node, "troupe_stream_resets_total", name); got != 1 {
		t.Fatalf("troupe_stream_resets_total{%s} = %v, want 1", name, got)
	}
}

// A keeper learns each stream's creation time and reports a stream that is
// a new one since its previous check — recreated by itself or by anyone
// else (another replica, an operator) — exactly once.
func TestStreamKeeperReportsAStreamRecreatedElsewhere(t *testing.T) {
	t.Parallel()
	env := testenv.NewWithPrivateNATS(t)
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	subj := bus.NewSubjects(env.Prefix)
	prefix := env.StreamPrefix()
	if err := bus.EnsureStreams(ctx, js, prefix, subj); err != nil {
		t.Fatal(err)
	}
	k := bus.NewStreamKeeper(js, prefix, subj, 1, quietLogger())
	var resets []string
	k.OnReset = func(_ bus.StreamKind, name string) { resets = append(resets, name) }
	check := func() {
		t.Helper()
		if err := k.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	check() // learns the creation times
	check()
	if len(resets) != 0 {
		t.Fatalf("resets %v with no stream recreated", resets)
	}
	name := bus.StreamName(prefix, bus.StreamResult)
	if err := js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	// Recreated by "another replica" before this keeper looked.
	if err := bus.EnsureStreams(ctx, js, prefix, subj); err != nil {
		t.Fatal(err)
	}
	check()
	check()
	if len(resets) != 1 || resets[0] != name {
		t.Fatalf("resets %v, want [%s] once", resets, name)
	}
}

// The RESULT and SUBMIT streams deleted under load, with `troupe worker`'s
// own code (deduping, reporting starts): submits refused while SUBMIT is
// missing are retried by the client until it is back (a JetStream publish
// gets no ack meanwhile); results sent while RESULT is missing are retried
// by their workers until it is back, and the node asks the workers of its
// jobs again once it sees the new stream (dispatches repeated: the repeats
// of jobs still running are answered with a progress). Every job ends
// SUCCEEDED, none runs twice. Here the node reads results as fast as they
// come, so the stream rarely holds one when deleted; the loss of held
// results is TestResultStreamLossAsksDedupingWorkersAgain's.
func TestFaultStreamsDeletedUnderLoad(t *testing.T) {
	t.Parallel()
	f := newFixtureIn(t, testenv.NewWithPrivateNATS(t), func(c *troupe.Config) {
		c.Tuning.StreamCheck = 200 * time.Millisecond
		c.Tuning.ResendAfter = 500 * time.Millisecond
	})
	var mu sync.Mutex
	runs := map[string]int{}
	for i, id := range []string{"ld-w1", "ld-w2"} {
		w, err := worker.Start(f.env.NATS, worker.Config{ID: id, Pool: "echo", Topics: []string{"job.echo"},
			Direct: true, Dedupe: true, Progress: true, MaxParallel: 64, SubjectPrefix: f.subj.Prefix(), Heartbeat: time.Second,
			Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
				mu.Lock()
				runs[req.JobId]++
				mu.Unlock()
				select {
				case <-time.After(time.Duration(100+(len(req.JobId)*37+i*53)%400) * time.Millisecond):
				case <-ctx.Done():
				}
				return worker.Echo(ctx, req)
			}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
	}
	f.waitWorkers(2)
	const n = 300
	names := map[bus.StreamKind]string{}
	for _, kind := range []bus.StreamKind{bus.StreamResult, bus.StreamSubmit} {
		names[kind] = bus.StreamName(f.env.StreamPrefix(), kind)
	}
	refused := 0
	submit := func(req *capv1.JobRequest) {
		data, err := bus.EncodeRequest("trace-"+req.JobId, "test-client", req)
		if err != nil {
			t.Fatal(err)
		}
		for try := 0; ; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := f.js.Publish(ctx, f.subj.Submit, data)
			cancel()
			if err == nil {
				return
			}
			if try == 100 {
				t.Fatalf("submit of %s refused 100 times: %v", req.JobId, err)
			}
			refused++
			time.Sleep(50 * time.Millisecond)
		}
	}
	for i := 0; i < n; i++ {
		submit(echoReq(fmt.Sprintf("ld-%d", i)))
		if i == n/2 {
			// A submit the stream acked but no node has taken yet goes with
			// the stream: nothing can bring it back (RELIABILITY.md). Delete
			// once every submit so far has its record, so that the test
			// loses none of its own; what follows is refused and retried.
			for j := 0; j <= i; j++ {
				f.waitRecordWithin(fmt.Sprintf("ld-%d", j), 30*time.Second)
			}
			for _, name := range names {
				if err := f.js.DeleteStream(context.Background(), name); err != nil {
					t.Fatal(err)
				}
			}
		}
		time.Sleep(5 * time.Millisecond) // ~200 submits/s: jobs finish while the streams are gone
	}
	for i := 0; i < n; i++ {
		f.waitStateWithin(fmt.Sprintf("ld-%d", i), jobstate.StateSucceeded, 60*time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, r := range runs {
		if r != 1 {
			t.Errorf("%s ran %d times", id, r)
		}
	}
	if len(runs) != n {
		t.Errorf("%d jobs ran, want %d", len(runs), n)
	}
	t.Logf("%d jobs SUCCEEDED, each run once; %d submit tries refused; result stream resets %v, dispatches repeated %v", n,
		refused, counter(t, f.node, "troupe_stream_resets_total", names[bus.StreamResult]),
		counter(t, f.node, "troupe_dispatch_resent_total", ""))
}

// A stream that exists and refuses every write (here: the SUBMIT stream
// replaced by one whose byte limit no message fits; one recreated while
// nats-server still deleted the old one answers the same err_code 10077)
// makes the node not ready, naming the stream, with
// troupe_stream_refusing{stream} at 1. Once it is gone (deleted by the
// operator, or by the keeper's repair once nothing is left in it), the node
// recreates it, the probe passes, and the node is ready again.
func TestReadyReportsAStreamThatRefusesWrites(t *testing.T) {
	t.Parallel()
	f := newFixtureIn(t, testenv.NewWithPrivateNATS(t), func(c *troupe.Config) { c.Tuning.StreamCheck = 100 * time.Millisecond })
	ctx := context.Background()
	name := bus.StreamName(f.env.StreamPrefix(), bus.StreamSubmit)
	if err := f.js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{f.subj.Submit, f.subj.Probe(bus.StreamSubmit)},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage}
	if _, err := f.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	// Held: the stream's consumer is gone with the old stream until the
	// keeper recreates it, so nothing takes this message.
	if _, err := f.js.Publish(ctx, f.subj.Submit, []byte("held")); err != nil {
		t.Fatal(err)
	}
	cfg.MaxBytes, cfg.Discard = 1, jetstream.DiscardNew
	if _, err := f.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f.node.Ready(ctx)
		var nr *troupe.NotReadyError
		if errors.As(err, &nr) && strings.Contains(nr.FailedChecks()[troupe.ReadyStreams], "refuses writes") {
			if !strings.Contains(nr.FailedChecks()[troupe.ReadyStreams], name) {
				t.Fatalf("not ready for the wrong stream: %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready = %v 20 s after the stream began refusing writes", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := counter(t, f.node, "troupe_stream_refusing", name); got != 1 {
		t.Fatalf("troupe_stream_refusing{%s} = %v, want 1", name, got)
	}
	if got := counter(t, f.node, "troupe_stream_probe_refusals_total", name); got < 1 {
		t.Fatalf("troupe_stream_probe_refusals_total{%s} = %v, want at least 1", name, got)
	}
	// The operator's repair; the keeper's own repair may have deleted the
	// emptied stream first.
	if err := f.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatal(err)
	}
	for err := f.node.Ready(ctx); err != nil; err = f.node.Ready(ctx) {
		if time.Now().After(deadline.Add(20 * time.Second)) {
			t.Fatalf("still not ready after the stream was deleted: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := counter(t, f.node, "troupe_stream_refusing", name); got != 0 {
		t.Fatalf("troupe_stream_refusing{%s} = %v after the repair, want 0", name, got)
	}
	f.submit(echoReq("after-repair"))
	f.startWorker("w1", true, nil, worker.Echo)
	f.waitStateWithin("after-repair", jobstate.StateSucceeded, 20*time.Second)
}

// Three replicas started at the same moment against fresh streams, twenty
// times (issue 27, item 9): none fails to start ("subjects overlap with an
// existing stream" made one exit).
func TestThreeReplicasStartTogether(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts 60 nodes")
	}
	pools, _ := parseTestPools()
	for round := range 20 {
		env := testenv.New(t)
		nodes := make([]*troupe.Node, 3)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range nodes {
			n, err := troupe.NewNode(troupe.Config{NodeID: fmt.Sprintf("r%d-n%d", round, i), NATSURL: env.NATSURL,
				RedisURL: env.RedisURL, KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix,
				StreamPrefix: env.StreamPrefix(), Pools: pools, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			nodes[i] = n
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = n.Start(context.Background())
			}()
		}
		close(start)
		wg.Wait()
		for i, n := range nodes {
			if errs[i] != nil {
				t.Errorf("round %d: replica %d failed to start: %v", round, i, errs[i])
				continue
			}
			_ = n.Stop(context.Background())
		}
	}
}

// Tuning.StreamMaxBytes is each input stream's bound (what JetStream
// reserves for it); below 1 MiB it is refused before anything starts.
func TestNodeStreamsTakeTheConfiguredMaxBytes(t *testing.T) {
	env := testenv.New(t)
	pools, _ := parseTestPools()
	cfg := troupe.Config{NodeID: "smb", NATSURL: env.NATSURL, RedisURL: env.RedisURL, KeyPrefix: env.KeyPrefix(),
		SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(), Pools: pools, Logger: quietLogger()}
	for _, bad := range []int64{-1, 1000} {
		cfg.Tuning.StreamMaxBytes = bad
		if _, err := troupe.NewNode(cfg); err == nil || !strings.Contains(err.Error(), "stream max bytes") {
			t.Errorf("StreamMaxBytes %d: err %v, want a refusal", bad, err)
		}
	}
	cfg.Tuning.StreamMaxBytes = 8 << 20
	n, err := troupe.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = n.Stop(context.Background()) }()
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"SUBMIT", "RESULT", "CANCEL"} {
		st, err := js.Stream(ctx, env.StreamPrefix()+"_"+kind)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if got := st.CachedInfo().Config.MaxBytes; got != 8<<20 {
			t.Errorf("%s MaxBytes %d, want %d", kind, got, 8<<20)
		}
	}
}
