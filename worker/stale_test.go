package worker_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// TestWorkerDropsADispatchStaleAfterASilence: a direct dispatch stamped
// with a heartbeat after which the worker went quiet for longer than the
// node's window allows is dropped, not run (the node may have placed the
// job elsewhere); the same job dispatched again with a heartbeat heard
// after the silence runs, once; a dispatch with no stamp runs as before.
func TestWorkerDropsADispatchStaleAfterASilence(t *testing.T) {
	env := testenv.New(t)
	subj := bus.NewSubjects(env.Prefix)
	beats := make(chan time.Time, 16)
	hbSub, err := env.NATS.Subscribe(subj.Heartbeat, func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetHeartbeat() != nil {
			beats <- p.GetCreatedAt().AsTime()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hbSub.Unsubscribe() }()
	_ = env.NATS.Flush()
	ran := make(chan string, 8)
	stale := make(chan string, 8)
	// Heartbeats only when the test says (Beat): the silence between two
	// of them is the pause a SIGSTOP would make.
	w, err := worker.Start(env.NATS, worker.Config{ID: "sw", Pool: "p", Topics: []string{"job.sw"}, Direct: true,
		Dedupe: true, SubjectPrefix: subj.Prefix(), Heartbeat: time.Hour,
		Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
			ran <- req.JobId
			return worker.Echo(ctx, req)
		},
		OnStale: func(_ string, req *capv1.JobRequest) { stale <- req.JobId }})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	nextBeat := func() time.Time {
		t.Helper()
		select {
		case at := <-beats:
			return at
		case <-time.After(5 * time.Second):
			t.Fatal("no heartbeat")
			return time.Time{}
		}
	}
	before := nextBeat() // the one Start sends
	const window = time.Second
	time.Sleep(window) // a silence the node evicts for (its window)
	w.Beat()
	after := nextBeat()
	dispatch := func(job string, heard time.Time) {
		t.Helper()
		req := &capv1.JobRequest{JobId: job, Topic: "job.sw"}
		if !heard.IsZero() {
			req.Env = map[string]string{registry.EnvHeardBeat: strconv.FormatInt(heard.UnixNano(), 10),
				registry.EnvEvictAfter: strconv.FormatInt(window.Milliseconds(), 10)}
		}
		data, err := bus.EncodeRequest("tr", "node", req)
		if err != nil {
			t.Fatal(err)
		}
		if err := env.NATS.Publish(subj.Worker("sw"), data); err != nil {
			t.Fatal(err)
		}
	}
	dispatch("j1", before) // sent before the silence, read after it
	select {
	case id := <-stale:
		if id != "j1" {
			t.Fatalf("dropped %s, want j1", id)
		}
	case id := <-ran:
		t.Fatalf("%s ran though it reached the worker after an evictable silence", id)
	case <-time.After(5 * time.Second):
		t.Fatal("stale dispatch neither dropped nor run")
	}
	dispatch("j1", after) // the node repeats it, having heard the worker since
	dispatch("j2", time.Time{})
	got := map[string]int{}
	for len(got) < 2 {
		select {
		case id := <-ran:
			got[id]++
		case id := <-stale:
			t.Fatalf("%s dropped as stale", id)
		case <-time.After(5 * time.Second):
			t.Fatalf("ran %v, want j1 and j2", got)
		}
	}
	if got["j1"] != 1 || got["j2"] != 1 || w.StaleDropped() != 1 {
		t.Fatalf("ran %v, stale %d; want j1 and j2 once each, 1 stale", got, w.StaleDropped())
	}
}

// TestWorkerRunsADispatchStampedWithinItsWindow: a worker that heartbeats
// steadily runs a dispatch stamped with any of its recent heartbeats.
func TestWorkerRunsADispatchStampedWithinItsWindow(t *testing.T) {
	env := testenv.New(t)
	subj := bus.NewSubjects(env.Prefix)
	w, err := worker.Start(env.NATS, worker.Config{ID: "sw2", Pool: "p", Topics: []string{"job.sw"}, Direct: true,
		SubjectPrefix: subj.Prefix(), Heartbeat: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	now := time.Now()
	req := &capv1.JobRequest{JobId: "j", Env: map[string]string{
		registry.EnvHeardBeat: strconv.FormatInt(now.Add(-10*time.Millisecond).UnixNano(), 10), registry.EnvEvictAfter: "10000"}}
	if w.StaleDispatch(req, now) {
		t.Fatal("a dispatch stamped 10 ms ago with a 10 s window is stale")
	}
	req.Env[registry.EnvEvictAfter] = "bad"
	if w.StaleDispatch(req, now) {
		t.Fatal("a dispatch with an unparsable stamp is stale")
	}
}
