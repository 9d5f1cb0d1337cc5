package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
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
	if err != nil || rec.State != troupe.StateSucceeded {
		t.Fatalf("wait: %v %+v", err, rec)
	}
	page, err := c.List(ctx, store.ListQuery{State: jobstate.StateSucceeded})
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
	if rec, err = c.Wait(ctx, "client-2"); err != nil || rec.State != troupe.StateCancelled {
		t.Fatalf("cancelled job: %v %+v", err, rec)
	}
	if err := c.Submit(ctx, &capv1.JobRequest{Topic: "job.echo"}); err == nil {
		t.Fatal("a submit without a job id was accepted")
	}
}

// A Client's payload is stored where CAP workers read it, within its size
// cap (an oversize one submits nothing), and Watch sends every state of
// the job, the last with its record.
func TestClientPayloadCapAndWatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.startWorker("w1", true, nil, worker.Echo)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := troupe.NewClient(ctx, troupe.ClientConfig{NATSURL: f.env.NATSURL, RedisURL: f.env.RedisURL,
		KeyPrefix: f.env.KeyPrefix(), SubjectPrefix: f.env.Prefix, WaitPoll: 10 * time.Millisecond, MaxPayloadBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big, small := f.env.Prefix+"-big", f.env.Prefix+"-small"
	t.Cleanup(func() { f.env.Client.Del(context.Background(), "ctx:"+big, "ctx:"+small) })

	err = c.SubmitPayload(ctx, &capv1.JobRequest{JobId: big, Topic: "job.echo"}, []byte(`"more than sixteen bytes"`))
	if !errors.Is(err, troupe.ErrTooLarge) {
		t.Fatalf("oversize payload: %v", err)
	}
	if err := c.SubmitPayload(ctx, &capv1.JobRequest{JobId: small, Topic: "job.echo"}, []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	var states []troupe.State
	var last troupe.JobEvent
	for ev := range c.Watch(ctx, small) {
		states = append(states, ev.State)
		last = ev
	}
	if len(states) < 3 || states[0] != troupe.StatePending || last.State != troupe.StateSucceeded || last.Record == nil {
		t.Fatalf("watched states %v, last %+v", states, last)
	}
	// Echo's result is its input: the client reads it back.
	if res, err := c.Result(ctx, small); err != nil || string(res) != `{"a":1}` {
		t.Fatalf("result %q %v", res, err)
	}
	// The oversize job was never submitted.
	if _, err := c.Job(ctx, big); !errors.Is(err, troupe.ErrNotFound) {
		t.Fatalf("oversize job: %v", err)
	}
}

// SubmitBatch submits every good job of a batch exactly once, reports the
// item it could not send (no job id) by index without holding back the
// rest, leaves the node to dead-letter the one it refuses (a bad id), and a
// second send of the same batch runs no job again.
func TestClientSubmitBatchSubmitsEachJobOnceAndReportsBadItems(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	rec := newReceipts()
	f.startWorker("w1", true, rec, worker.Echo)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := troupe.NewClient(ctx, troupe.ClientConfig{NATSURL: f.env.NATSURL, RedisURL: f.env.RedisURL,
		KeyPrefix: f.env.KeyPrefix(), SubjectPrefix: f.env.Prefix, WaitPoll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	const good = 300
	var batch []*capv1.JobRequest
	for i := range good {
		batch = append(batch, &capv1.JobRequest{JobId: fmt.Sprintf("batch-%d", i), Topic: "job.echo"})
		if i == 100 {
			batch = append(batch, &capv1.JobRequest{Topic: "job.echo"}) // index 101: no job id
		}
		if i == 200 {
			batch = append(batch, &capv1.JobRequest{JobId: "batch bad*>", Topic: "job.echo"}) // the node refuses it
		}
	}
	check := func(err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "batch item 101 ") || !strings.Contains(err.Error(), "no job id") ||
			strings.Count(err.Error(), "batch item") != 1 {
			t.Fatalf("batch error: want exactly item 101 without a job id, got %v", err)
		}
	}
	check(c.SubmitBatch(ctx, batch))
	for i := range good {
		if j, err := c.Wait(ctx, fmt.Sprintf("batch-%d", i)); err != nil || j.State != troupe.StateSucceeded {
			t.Fatalf("batch-%d: %v %+v", i, err, j)
		}
	}
	f.waitDLQ(func(e store.DLQEntry) bool {
		return e.Reason == jobstate.ReasonInvalidRequest && e.JobID == "batch bad*>"
	})

	// Sent again: the node takes every packet (none left pending) and
	// creates no job a second time.
	check(c.SubmitBatch(ctx, batch))
	waitNoPending(t, f.js, bus.StreamName(f.env.StreamPrefix(), bus.StreamSubmit), bus.ConsumerName(bus.StreamSubmit))
	for i := range good {
		id := fmt.Sprintf("batch-%d", i)
		if n := rec.count(id); n != 1 {
			t.Fatalf("%s received %d times, want once", id, n)
		}
		if j, err := c.Job(ctx, id); err != nil || j.State != troupe.StateSucceeded {
			t.Fatalf("%s after the resend: %v %+v", id, err, j)
		}
	}
}
