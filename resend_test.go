package troupe_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

func fastResend(c *troupe.Config) { c.Tuning.ResendAfter = 150 * time.Millisecond }

// lossyWorker is a hand-written CAP worker on raw NATS that announces direct
// dispatch and dedupe, drops the first delivery of every job (as a NATS
// restart would) and answers the next one.
type lossyWorker struct {
	mu         sync.Mutex
	deliveries map[string][]time.Time
}

func startLossyWorker(t *testing.T, f *fixture, id string) *lossyWorker {
	t.Helper()
	lw := &lossyWorker{deliveries: map[string][]time.Time{}}
	nc := f.env.NATS
	sub, err := nc.Subscribe(f.subj.Worker(id), func(m *nats.Msg) {
		pkt, err := bus.Decode(m.Data)
		if err != nil || pkt.GetJobRequest() == nil {
			return
		}
		req := pkt.GetJobRequest()
		lw.mu.Lock()
		lw.deliveries[req.JobId] = append(lw.deliveries[req.JobId], time.Now())
		n := len(lw.deliveries[req.JobId])
		lw.mu.Unlock()
		if n != 2 {
			return // the first is "lost"; later ones are repeats of a job it already answered
		}
		data, err := bus.EncodeResult(pkt.TraceId, id, &capv1.JobResult{JobId: req.JobId, WorkerId: id,
			Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: req.ContextPtr})
		if err == nil {
			f.publishRaw(f.subj.Result, data)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	f.heartbeatAs(t, id, map[string]string{registry.LabelDispatch: registry.DispatchDirect,
		registry.LabelDedupe: registry.DedupeJobID})
	return lw
}

// heartbeatAs publishes worker id's heartbeat (pool echo, max_parallel 64,
// labels) now and every second until the test ends, and waits until the
// router has seen it: a hand-written CAP worker's liveness.
func (f *fixture) heartbeatAs(t *testing.T, id string, labels map[string]string) {
	t.Helper()
	beat := func() {
		data, _ := bus.EncodeHeartbeat(id, &capv1.Heartbeat{WorkerId: id, Pool: "echo", MaxParallelJobs: 64,
			Labels: labels})
		_ = f.env.NATS.Publish(f.subj.Heartbeat, data)
	}
	beat()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				beat()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	f.waitWorkers(1)
}

func (lw *lossyWorker) times(id string) []time.Time {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return append([]time.Time(nil), lw.deliveries[id]...)
}

func TestLostDirectDispatchIsResentToADedupingWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fastResend)
	lw := startLossyWorker(t, f, "lossy")
	ids := []string{"rs-1", "rs-2", "rs-3"}
	for _, id := range ids {
		f.submit(echoReq(id))
	}
	for _, id := range ids {
		rec := f.waitState(id, jobstate.StateSucceeded)
		if rec.Attempts != 1 {
			t.Errorf("%s: %d scheduling attempts, want 1 (a resend is the same dispatch)", id, rec.Attempts)
		}
		ts := lw.times(id)
		if len(ts) < 2 {
			t.Fatalf("%s: delivered %d times, want the lost dispatch repeated", id, len(ts))
		}
		if gap := ts[1].Sub(ts[0]); gap < 100*time.Millisecond {
			t.Errorf("%s: repeated %v after the first delivery, before ResendAfter", id, gap)
		}
	}
	if n := counter(t, f.node, "troupe_dispatch_resent_total", ""); n < float64(len(ids)) {
		t.Errorf("troupe_dispatch_resent_total = %v, want ≥ %d", n, len(ids))
	}
}

func TestResendStopsOnceTheDedupingWorkerConfirms(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fastResend)
	var runs, dups atomic.Int32
	release := make(chan struct{})
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "holder", Pool: "echo", Topics: []string{"job.echo"},
		Direct: true, Dedupe: true, SubjectPrefix: f.subj.Prefix(), Heartbeat: time.Second,
		Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
			<-release
			return worker.Echo(ctx, req)
		},
		OnReceive:   func(string, *capv1.JobRequest) { runs.Add(1) },
		OnDuplicate: func(string, *capv1.JobRequest) { dups.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // runs before w.Stop, which waits for the handler
	f.waitWorkers(1)
	f.submit(echoReq("rs-held"))
	// The worker never reports progress by itself: the job becomes RUNNING
	// only through the worker's answer to a repeated dispatch.
	rec := f.waitState("rs-held", jobstate.StateRunning)
	if dups.Load() < 1 {
		t.Fatalf("RUNNING (%s) without a repeated delivery", reasons(rec.History))
	}
	// The node's count of repeats is final once the job is RUNNING: a repeat
	// is published by the actor before it records the progress, never after
	// (a delivery still in flight may reach the worker later, so the
	// worker's count is not used here).
	atRunning := counter(t, f.node, "troupe_dispatch_resent_total", "")
	// Repeats back off from 150 ms; had they gone on, 1.5 s would hold
	// three or four more.
	time.Sleep(1500 * time.Millisecond)
	if n := counter(t, f.node, "troupe_dispatch_resent_total", ""); n != atRunning {
		t.Errorf("dispatch repeated %v more times after the worker confirmed it", n-atRunning)
	}
	free()
	f.waitState("rs-held", jobstate.StateSucceeded)
	if r := runs.Load(); r != 1 {
		t.Errorf("handler ran %d times, want 1", r)
	}
}

func TestNoResendToAWorkerThatDoesNotDedupe(t *testing.T) {
	t.Parallel()
	f := newFixture(t, fastResend)
	rec := newReceipts()
	f.startWorker("plain", true, rec, worker.Sleep(time.Second))
	f.submit(echoReq("rs-plain"))
	f.waitState("rs-plain", jobstate.StateSucceeded)
	if n := rec.count("rs-plain"); n != 1 {
		t.Errorf("delivered %d times to a worker that does not dedupe, want 1", n)
	}
	if n := counter(t, f.node, "troupe_dispatch_resent_total", ""); n != 0 {
		t.Errorf("troupe_dispatch_resent_total = %v, want 0", n)
	}
}
