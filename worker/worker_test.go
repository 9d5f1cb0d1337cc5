package worker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// A deduping worker runs a job id once however often it arrives, answers a
// repeat of a running job with a RUNNING progress, and says it dedupes in its
// heartbeat.
func TestDedupingWorkerRunsAJobOnceAndConfirmsRepeats(t *testing.T) {
	env := testenv.New(t)
	subj := bus.NewSubjects(env.Prefix)
	var runs, dups atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{}, 4)
	progress := make(chan *capv1.JobProgress, 8)
	beats := make(chan *capv1.Heartbeat, 8)
	sub, err := env.NATS.Subscribe(subj.Progress, func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetJobProgress() != nil {
			progress <- p.GetJobProgress()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	hbSub, err := env.NATS.Subscribe(subj.Heartbeat, func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetHeartbeat() != nil {
			select {
			case beats <- p.GetHeartbeat():
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hbSub.Unsubscribe() }()
	_ = env.NATS.Flush()
	w, err := worker.Start(env.NATS, worker.Config{ID: "dd", Pool: "p", Topics: []string{"job.dd"}, Direct: true,
		Dedupe: true, SubjectPrefix: subj.Prefix(), Heartbeat: time.Hour,
		Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
			runs.Add(1)
			started <- struct{}{}
			<-release
			return worker.Echo(ctx, req)
		},
		OnDuplicate: func(string, *capv1.JobRequest) { dups.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	defer close(release) // before Stop, which waits for the handler
	select {
	case hb := <-beats:
		if hb.Labels[registry.LabelDedupe] != registry.DedupeJobID {
			t.Fatalf("heartbeat labels %v: no %s=%s", hb.Labels, registry.LabelDedupe, registry.DedupeJobID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no heartbeat")
	}
	data, err := bus.EncodeRequest("tr", "node", &capv1.JobRequest{JobId: "dd-1", Topic: "job.dd"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := env.NATS.Publish(subj.Worker("dd"), data); err != nil {
			t.Fatal(err)
		}
		if i == 0 { // the job runs before its repeats arrive
			select {
			case <-started:
			case <-time.After(5 * time.Second):
				t.Fatal("the first delivery did not run")
			}
		}
	}
	for i := 0; i < 2; i++ { // one RUNNING progress per repeat
		select {
		case p := <-progress:
			if p.JobId != "dd-1" || p.Status != capv1.JobStatus_JOB_STATUS_RUNNING {
				t.Fatalf("progress %+v", p)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d progress answers to 2 repeats", i)
		}
	}
	if r, d := runs.Load(), dups.Load(); r != 1 || d != 2 {
		t.Fatalf("3 deliveries: %d runs and %d repeats seen, want 1 and 2", r, d)
	}
}

// A JobCancel on sys.job.cancel stops the job where it runs: its handler's
// context ends, and the worker sends no answer (the canceller decided the
// outcome; an answer could race the cancel to the node). Other jobs are not
// touched: they answer as usual.
func TestWorkerStopsAJobOnItsCancel(t *testing.T) {
	env := testenv.New(t)
	subj := bus.NewSubjects(env.Prefix)
	results := make(chan *capv1.JobResult, 4)
	sub, err := env.NATS.Subscribe(subj.Result, func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetJobResult() != nil {
			results <- p.GetJobResult()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	stopped := make(chan string, 2)
	release := make(chan struct{})
	w, err := worker.Start(env.NATS, worker.Config{ID: "cw", Pool: "p", Topics: []string{"job.cw"}, Direct: true,
		SubjectPrefix: subj.Prefix(), Heartbeat: time.Hour,
		Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
			select {
			case <-ctx.Done():
				stopped <- req.JobId
				return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_CANCELLED}
			case <-release:
				return worker.Echo(ctx, req)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for _, id := range []string{"cw-1", "cw-2"} {
		data, _ := bus.EncodeRequest("tr", "node", &capv1.JobRequest{JobId: id, Topic: "job.cw"})
		if err := env.NATS.Publish(subj.Worker("cw"), data); err != nil {
			t.Fatal(err)
		}
	}
	_ = env.NATS.Flush()
	cancel, _ := bus.EncodeCancel("tr", "node", &capv1.JobCancel{JobId: "cw-1", Reason: "stop"})
	// The jobs start asynchronously: repeat the cancel until it lands.
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case id := <-stopped:
			if id != "cw-1" {
				t.Fatalf("the cancel stopped %s", id)
			}
			break wait
		case <-tick.C:
			_ = env.NATS.Publish(subj.Cancel, cancel)
		case <-deadline:
			t.Fatal("the cancelled job was never stopped")
		}
	}
	close(release)
	select {
	case r := <-results:
		if r.JobId != "cw-2" || r.Status != capv1.JobStatus_JOB_STATUS_SUCCEEDED {
			t.Fatalf("result %v, want only cw-2's SUCCEEDED", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cw-2 never answered")
	}
	select {
	case r := <-results:
		if r.JobId == "cw-1" {
			t.Fatalf("the cancelled job answered: %v", r)
		}
	case <-time.After(200 * time.Millisecond):
	}
}

// A deduping worker answers a repeat of a job it finished with the job's
// result again (the node repeats a dispatch when its result stream lost
// results), without running it again; only the last ResultKeep results are
// kept, and a repeat of an older job is dropped.
func TestDedupingWorkerSendsAFinishedJobsResultAgain(t *testing.T) {
	env := testenv.New(t)
	subj := bus.NewSubjects(env.Prefix)
	results := make(chan *capv1.JobResult, 8)
	sub, err := env.NATS.Subscribe(subj.Result, func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetJobResult() != nil {
			_ = m.Respond([]byte(`{"stream":"T","seq":1}`)) // as JetStream acks it
			results <- p.GetJobResult()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = env.NATS.Flush()
	var runs atomic.Int32
	w, err := worker.Start(env.NATS, worker.Config{ID: "rk", Pool: "p", Topics: []string{"job.rk"}, Direct: true,
		Dedupe: true, ResultKeep: 1, SubjectPrefix: subj.Prefix(), Heartbeat: time.Hour,
		Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
			runs.Add(1)
			return worker.Echo(ctx, req)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	send := func(id string) {
		t.Helper()
		data, _ := bus.EncodeRequest("tr", "node", &capv1.JobRequest{JobId: id, Topic: "job.rk", ContextPtr: "ctx-" + id})
		if err := env.NATS.Publish(subj.Worker("rk"), data); err != nil {
			t.Fatal(err)
		}
	}
	next := func(what string) *capv1.JobResult {
		t.Helper()
		select {
		case r := <-results:
			return r
		case <-time.After(5 * time.Second):
			t.Fatalf("no result: %s", what)
			return nil
		}
	}
	// askAgain repeats a job until a result comes: a repeat that arrives
	// while the first answer is still being sent is dropped (it is on its
	// way).
	askAgain := func(id string) *capv1.JobResult {
		t.Helper()
		for i := 0; i < 25; i++ {
			send(id)
			select {
			case r := <-results:
				return r
			case <-time.After(200 * time.Millisecond):
			}
		}
		t.Fatalf("no result sent again for %s", id)
		return nil
	}
	send("rk-1")
	first := next("first delivery")
	again := askAgain("rk-1")
	if again.JobId != "rk-1" || again.Status != first.Status || again.ResultPtr != first.ResultPtr || again.WorkerId != "rk" {
		t.Fatalf("result sent again %+v, first %+v", again, first)
	}
	send("rk-2")
	next("second job")
	if r := askAgain("rk-2"); r.JobId != "rk-2" {
		t.Fatalf("result of %s sent again; want rk-2's", r.JobId)
	}
	send("rk-1") // its result is no longer kept (ResultKeep 1)
	if r := askAgain("rk-2"); r.JobId != "rk-2" {
		t.Fatalf("result of %s sent again; want only rk-2's", r.JobId)
	}
	for quiet := time.After(300 * time.Millisecond); ; {
		select {
		case r := <-results:
			if r.JobId != "rk-2" {
				t.Fatalf("a result for %s, whose result is no longer kept", r.JobId)
			}
			continue
		case <-quiet:
		}
		break
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs for 2 jobs delivered 5 times, want 2", n)
	}
}

// A result stream at its cap refuses a result (DiscardNew); the worker
// publishes it again, with backoff, until the stream has room and stores it.
func TestWorkerPublishesARefusedResultAgain(t *testing.T) {
	env := testenv.New(t)
	subj := bus.NewSubjects(env.Prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: env.StreamPrefix() + "_RESULT",
		Subjects: []string{subj.Result}, MaxMsgs: 1, Discard: jetstream.DiscardNew, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subj.Result, []byte("filler")); err != nil { // the stream is full
		t.Fatal(err)
	}
	tries := make(chan struct{}, 64)
	sub, err := env.NATS.Subscribe(subj.Result, func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetJobResult().GetJobId() == "rf-1" {
			select {
			case tries <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = env.NATS.Flush()
	w, err := worker.Start(env.NATS, worker.Config{ID: "rf", Pool: "p", Topics: []string{"job.rf"}, Direct: true,
		SubjectPrefix: subj.Prefix(), Heartbeat: time.Hour, Handler: worker.Echo})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	data, err := bus.EncodeRequest("tr", "node", &capv1.JobRequest{JobId: "rf-1", Topic: "job.rf"})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.NATS.Publish(subj.Worker("rf"), data); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // the first publish, refused, and one more
		select {
		case <-tries:
		case <-ctx.Done():
			t.Fatalf("%d result publishes seen, want a refused one published again", i)
		}
	}
	if err := stream.Purge(ctx); err != nil { // room again
		t.Fatal(err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(50 * time.Second)) // the first message stored after the purge
	if err != nil {
		t.Fatalf("the refused result was never stored: %v", err)
	}
	if p, err := bus.Decode(msg.Data()); err != nil || p.GetJobResult().GetJobId() != "rf-1" {
		t.Fatalf("stored %v, %v; want rf-1's result", p, err)
	}
}

// TestHeartbeatDefaultIsTheNodesSDKHeartbeat: the worker's default beat and
// the interval the node's start-up check assumes of CAP SDK workers are the
// same figure (the public constant cannot name the internal one).
func TestHeartbeatDefaultIsTheNodesSDKHeartbeat(t *testing.T) {
	if worker.HeartbeatDefault != registry.SDKHeartbeat {
		t.Fatalf("worker.HeartbeatDefault %v, registry.SDKHeartbeat %v: want equal", worker.HeartbeatDefault, registry.SDKHeartbeat)
	}
}
