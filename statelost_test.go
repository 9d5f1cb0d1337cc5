package troupe_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// A client whose job's record Redis lost is told, on the result subject
// like every other outcome Troupe decides: FAILED with error_code
// state_lost — once, however many of the job's events are dead-lettered
// after (here its worker's result, then a cancel from the client).
func TestClientIsToldOnceWhenItsJobsRecordWasLost(t *testing.T) {
	t.Parallel()
	toldOnceWhenLost(t, 1)
}

// The same with two replicas: whichever reads the told outcome back from
// the result stream acks it (it is no event for the job), so the job gets
// exactly one DLQ entry per event of its own and one tell.
func TestClientIsToldOnceWhenItsJobsRecordWasLostOnTwoReplicas(t *testing.T) {
	t.Parallel()
	toldOnceWhenLost(t, 2)
}

func toldOnceWhenLost(t *testing.T, replicas int) {
	fast := func(c *troupe.Config) {
		parkFast(c)
		c.Tuning.LockTTL = 1500 * time.Millisecond // the lease, and the epoch check, every 0.5 s
	}
	f := newFixture(t, fast)
	nodes := []*troupe.Node{f.node}
	if replicas == 2 {
		nodes = append(nodes, newNodeOn(t, f, "node-b", fast))
	}
	const id = "job-told-lost"
	told := make(chan *capv1.JobResult, 10)
	sub, err := f.env.NATS.Subscribe(f.subj.Result, func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetJobResult().GetJobId() == id && p.GetJobResult().GetWorkerId() == "" {
			told <- p.GetJobResult()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	rec := newReceipts()
	release := f.holdingWorker("w1", rec)
	f.submit(echoReq(id))
	<-rec.ch
	waitParkedOnOne(t, nodes)
	ctx := context.Background()
	keys, err := f.env.Redis.Keys(ctx, f.env.KeyPrefix()+"*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("keys of the test: %v %v", keys, err)
	}
	for _, k := range keys { // one by one: they span hash slots
		f.env.Redis.Del(ctx, k)
	}
	for _, n := range nodes {
		waitCounter(t, n, "troupe_redis_data_loss_total", "", 1)
	}
	release.open(id)

	select {
	case r := <-told:
		if r.Status != capv1.JobStatus_JOB_STATUS_FAILED || r.ErrorCode != string(jobstate.ReasonStateLost) {
			t.Fatalf("told %v %q, want FAILED state_lost", r.Status, r.ErrorCode)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the client was never told its job's record was lost")
	}

	// A second event for the job: dead-lettered again, not told again.
	data, err := bus.EncodeCancel("trace-"+id, "test-client", &capv1.JobCancel{JobId: id, Reason: "late", RequestedBy: "test-client"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(ctx, f.subj.Cancel, data); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for lost := 0; lost < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("%d state_lost DLQ entries for the job, want 2 (its result, the cancel)", lost)
		}
		time.Sleep(20 * time.Millisecond)
		es, err := f.node.Store().ListDLQ(ctx, 100)
		if err != nil {
			continue
		}
		lost = 0
		for _, e := range es {
			if e.JobID == id && e.Reason == jobstate.ReasonStateLost {
				lost++
			}
		}
	}
	// The tell follows its DLQ entry by one Redis round trip and a core
	// NATS publish; a round trip through the server orders after it.
	time.Sleep(500 * time.Millisecond)
	_ = f.env.NATS.Flush()
	select {
	case r := <-told:
		t.Fatalf("told again: %v %q", r.Status, r.ErrorCode)
	default:
	}
	// Every told outcome read back from the result stream, by any replica,
	// is settled: no further DLQ entry came of it.
	waitNoPending(t, f.js, bus.StreamName(f.env.StreamPrefix(), bus.StreamResult), bus.ConsumerName(bus.StreamResult))
	if n := dlqEntriesFor(t, f, id); n != 2 {
		t.Fatalf("%d DLQ entries for the job, want 2 (its result, the cancel)", n)
	}
}

// waitParkedOnOne waits until the one job is parked by whichever of the
// nodes took its submit (any replica may), with no actor live on any.
func waitParkedOnOne(t *testing.T, nodes []*troupe.Node) {
	t.Helper()
	ctx := context.Background()
	var parked, live int64
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		parked, live = 0, 0
		for _, n := range nodes {
			p, err := n.Store().ParkedCount(ctx, n.ID())
			if err != nil {
				p = -1
			}
			l, _ := n.LiveJobActors()
			parked, live = parked+p, live+int64(l)
		}
		if parked == 1 && live == 0 {
			return
		}
	}
	t.Fatalf("%d jobs parked and %d actors live on %d nodes, want 1 parked and none live", parked, live, len(nodes))
}
