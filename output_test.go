package troupe_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// The output policy in both phases: a result whose metadata carries a
// secret is held back before it is called SUCCEEDED (phase 1, with a DLQ
// entry); a result whose content behind the pointer carries one is released,
// then downgraded to OUTPUT_QUARANTINED by the content scan (phase 2); a
// clean result stays SUCCEEDED with its output-safety record.
func TestOutputPolicyPhases(t *testing.T) {
	t.Parallel()
	policy, err := safety.ParseOutputPolicy([]byte("version: o1\nscanners:\n  secrets: {decision: quarantine}\n"))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *troupe.Config) { c.Output = policy })
	result := f.results()
	ctx := context.Background()
	const awsKey = "AKIAIOSFODNN7EXAMPLE"
	// Result contents live in Redis under res:<job_id> (CAP's convention).
	f.env.Redis.Set(ctx, "res:out-content", "the key is "+awsKey, 0)
	f.env.Redis.Set(ctx, "res:out-clean", "nothing to see", 0)
	t.Cleanup(func() { f.env.Redis.Del(context.Background(), "res:out-content", "res:out-clean") })
	f.startWorker("w1", true, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		res := &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: "redis://res:" + req.JobId}
		if req.JobId == "out-meta" {
			res.ErrorMessage = "debug: aws key " + awsKey
		}
		return res
	})
	for _, id := range []string{"out-meta", "out-content", "out-clean"} {
		f.submit(echoReq(id))
	}
	r := f.waitState("out-meta", jobstate.StateOutputQuarantined)
	if r.History[len(r.History)-2].To != jobstate.StateRunning || r.Fields["output_meta_decision"] == "" {
		t.Fatalf("phase 1: %s %v", reasons(r.History), r.Fields)
	}
	f.waitDLQ(func(e store.DLQEntry) bool {
		return e.JobID == "out-meta" && e.Reason == jobstate.ReasonOutputQuarantined
	})
	// The client, which heard SUCCEEDED from the worker, hears the verdict.
	if res := result("out-meta"); res.Status != capv1.JobStatus_JOB_STATUS_OUTPUT_QUARANTINED ||
		res.ErrorCode != string(jobstate.ReasonOutputQuarantined) {
		t.Fatalf("outcome published: %v %q", res.Status, res.ErrorCode)
	}

	r = f.waitState("out-content", jobstate.StateOutputQuarantined)
	n := len(r.History)
	if r.History[n-2].To != jobstate.StateSucceeded || r.History[n-1].Reason != jobstate.ReasonOutputQuarantined {
		t.Fatalf("phase 2: %s", reasons(r.History))
	}
	r = f.waitState("out-clean", jobstate.StateSucceeded)
	if r.Fields["output_meta_decision"] != "allow" {
		t.Fatalf("clean: %v", r.Fields)
	}
}

// blockingScan allows every result's metadata, then holds each content scan
// until released and quarantines it.
type blockingScan struct {
	started chan string
	release chan struct{}
}

func (b *blockingScan) CheckMeta(context.Context, *capv1.OutputCheckRequest) (*safety.OutputVerdict, error) {
	return &safety.OutputVerdict{Decision: capv1.OutputDecision_OUTPUT_DECISION_ALLOW, RuleID: "meta-ok"}, nil
}

func (b *blockingScan) ScanContent(ctx context.Context, req *capv1.OutputCheckRequest, _ []byte) (*safety.OutputVerdict, error) {
	b.started <- req.JobId
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &safety.OutputVerdict{Decision: capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE, RuleID: "late-find",
		Reason: "found after release"}, nil
}

// The content scan races a cancel: the cancel reaches a job that is already
// SUCCEEDED and is absorbed (a terminal job never moves for it); the scan's
// downgrade then applies, because the job is still SUCCEEDED — the one
// exit from a terminal state, taken exactly once.
func TestAsyncDowngradeRacingACancel(t *testing.T) {
	t.Parallel()
	scan := &blockingScan{started: make(chan string, 1), release: make(chan struct{})}
	f := newFixture(t, func(c *troupe.Config) { c.Output = scan })
	ctx := context.Background()
	f.env.Redis.Set(ctx, "res:race-1", "content", 0)
	t.Cleanup(func() { f.env.Redis.Del(context.Background(), "res:race-1") })
	f.startWorker("w1", true, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: "redis://res:" + req.JobId}
	})
	f.submit(echoReq("race-1"))
	if id := <-scan.started; id != "race-1" {
		t.Fatalf("scan of %s", id)
	}
	f.waitState("race-1", jobstate.StateSucceeded)
	before := counter(t, f.node, "troupe_duplicates_absorbed_total", "cancel")
	if err := f.node.Cancel(ctx, "race-1", "too late", "tester"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); counter(t, f.node, "troupe_duplicates_absorbed_total", "cancel") == before; {
		if time.Now().After(deadline) {
			t.Fatal("the cancel of a SUCCEEDED job was not absorbed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(scan.release)
	r := f.waitState("race-1", jobstate.StateOutputQuarantined)
	var got []jobstate.State
	for _, h := range r.History {
		got = append(got, h.To)
	}
	want := []jobstate.State{jobstate.StatePending, jobstate.StateScheduled, jobstate.StateDispatched, jobstate.StateRunning,
		jobstate.StateSucceeded, jobstate.StateOutputQuarantined}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("history %v, want %v", got, want)
	}
}
