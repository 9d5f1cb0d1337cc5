package troupe_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/store"
	"github.com/troupe-run/troupe/worker"
)

// A Client, which runs no scheduler, submits to the nodes, waits for a
// job's end, lists jobs and cancels one.
func TestClientSubmitsWaitsListsAndCancels(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.startWorker("w1", true, nil, worker.Echo)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := troupe.NewClient(ctx, troupe.ClientConfig{NATSURL: f.env.NATSURL, RedisURL: f.env.RedisURL,
		KeyPrefix: f.env.KeyPrefix(), SubjectPrefix: f.env.Prefix, WaitPoll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	if err := c.Submit(ctx, &capv1.JobRequest{JobId: "client-1", Topic: "job.echo"}); err != nil {
		t.Fatal(err)
	}
	rec, err := c.Wait(ctx, "client-1")
	if err != nil || rec.State != core.StateSucceeded {
		t.Fatalf("wait: %v %+v", err, rec)
	}
	page, err := c.List(ctx, store.ListQuery{State: core.StateSucceeded})
	if err != nil || !slices.ContainsFunc(page.Jobs, func(j store.JobSummary) bool { return j.ID == "client-1" }) {
		t.Fatalf("list SUCCEEDED: %v %+v", err, page)
	}
	page, err = c.List(ctx, store.ListQuery{})
	if err != nil || !slices.ContainsFunc(page.Jobs, func(j store.JobSummary) bool { return j.ID == "client-1" }) {
		t.Fatalf("list of every state: %v %+v", err, page)
	}

	// A job no topic routes to waits; the client cancels it.
	if err := c.Submit(ctx, &capv1.JobRequest{JobId: "client-2", Topic: "job.nowhere"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Cancel(ctx, "client-2", "not wanted", "test"); err != nil {
		t.Fatal(err)
	}
	if rec, err = c.Wait(ctx, "client-2"); err != nil || rec.State != core.StateCancelled {
		t.Fatalf("cancelled job: %v %+v", err, rec)
	}
	if err := c.Submit(ctx, &capv1.JobRequest{Topic: "job.echo"}); err == nil {
		t.Fatal("a submit without a job id was accepted")
	}
}
