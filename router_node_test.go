package troupe_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/bus"
	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/registry"
	"github.com/troupe-run/troupe/worker"
)

// A worker that takes a job and then dies (no more heartbeats, no result)
// costs the job a re-dispatch to another worker, not a dispatch timeout.
func TestEvictedWorkersJobsAreDispatchedElsewhere(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) { c.WorkerTTL = time.Second })
	nc := f.env.NATS
	got := make(chan string, 1)
	sub, err := nc.Subscribe(f.subj.Worker("doomed"), func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetJobRequest() != nil {
			got <- p.GetJobRequest().JobId
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	beat := func() {
		data, _ := bus.EncodeHeartbeat("doomed", &capv1.Heartbeat{WorkerId: "doomed", Pool: "echo", MaxParallelJobs: 10,
			Labels: map[string]string{registry.LabelDispatch: registry.DispatchDirect}})
		_ = nc.Publish(f.subj.Heartbeat, data)
	}
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			beat()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	f.waitWorkers(1)
	f.submit(echoReq("job-orphan"))
	if id := <-got; id != "job-orphan" {
		t.Fatalf("doomed worker got %s", id)
	}
	close(stop) // the worker dies holding the job
	rec := newReceipts()
	f.startWorker("survivor", true, rec, worker.Echo)
	r := f.waitState("job-orphan", core.StateSucceeded)
	if !strings.Contains(reasons(r.History), "SCHEDULED:worker_lost DISPATCHED:dispatched") || r.Worker != "survivor" {
		t.Fatalf("history %s worker %s", reasons(r.History), r.Worker)
	}
	if r.Fields["lost_worker"] != "doomed" {
		t.Fatalf("lost_worker %q", r.Fields["lost_worker"])
	}
}

// A topic mapping added at run time through Redis is used by the node.
func TestRuntimeTopicMapping(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "wn", Pool: "newpool", Topics: []string{"job.new"},
		Direct: true, Subjects: f.subj, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	f.waitWorkers(1)
	if err := f.node.Mappings().Set(context.Background(), "job.new", "newpool"); err != nil {
		t.Fatal(err)
	}
	f.submit(&capv1.JobRequest{JobId: "job-mapped", Topic: "job.new"})
	r := f.waitState("job-mapped", core.StateSucceeded)
	if r.Worker != "wn" {
		t.Fatalf("worker %s", r.Worker)
	}
}
