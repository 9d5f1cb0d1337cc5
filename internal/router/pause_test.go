package router

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// TestPausedTopicWaitsInOrderUntilResumed: with its topic paused, a job is
// not placed though its pool has room: it waits queued, pool_paused, while
// another topic of the same pool is placed; the resume (a new config)
// places the waiting jobs in their queue order.
func TestPausedTopicWaitsInOrderUntilResumed(t *testing.T) {
	t.Parallel()
	cfg := mustPools(t, "topics: {job.a: a, job.b: a}\n")
	b := setupRouter(t, Config{Pools: cfg.WithPaused(map[string]bool{"job.a": true})})
	b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "a", MaxParallelJobs: 10}, time.Now())
	pid, p := startProbe(b)
	t0 := time.Now()
	for i, id := range []string{"a-2", "a-1", "a-3"} {
		submitted := map[string]time.Duration{"a-1": 1, "a-2": 2, "a-3": 3}[id]
		b.sys.Root.Send(pid, &PickRequest{JobID: id, Wait: true, Ticket: 1, Submitted: t0.Add(submitted * time.Millisecond),
			Req: &capv1.JobRequest{JobId: id, Topic: "job.a"}})
		if r := p.reply(t); !r.Queued || r.Reason != jobstate.ReasonPoolPaused || r.WorkerID != "" {
			t.Fatalf("job %d of a paused topic: %+v, want queued pool_paused", i, r)
		}
	}
	b.sys.Root.Send(pid, &PickRequest{JobID: "b-1", Wait: true, Ticket: 1, Req: &capv1.JobRequest{JobId: "b-1", Topic: "job.b"}})
	if r := p.reply(t); r.WorkerID != "w1" {
		t.Fatalf("a job of another topic of the pool: %+v, want placed on w1", r)
	}
	b.sys.Root.Send(b.pid, &SetPools{Config: cfg.WithPaused(nil)})
	for _, want := range []string{"a-1", "a-2", "a-3"} {
		if m := p.next(t); m.JobID != want || m.Reply.WorkerID != "w1" {
			t.Fatalf("after the resume placed %s on %q, want %s on w1", m.JobID, m.Reply.WorkerID, want)
		}
	}
}
