package troupe_test

import (
	"context"
	"testing"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/store"
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
	r := f.waitState("out-meta", core.StateOutputQuarantined)
	if r.History[len(r.History)-2].To != core.StateRunning || r.Fields["output_meta_decision"] == "" {
		t.Fatalf("phase 1: %s %v", reasons(r.History), r.Fields)
	}
	f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == "out-meta" && e.Reason == core.ReasonOutputQuarantined })

	r = f.waitState("out-content", core.StateOutputQuarantined)
	n := len(r.History)
	if r.History[n-2].To != core.StateSucceeded || r.History[n-1].Reason != core.ReasonOutputQuarantined {
		t.Fatalf("phase 2: %s", reasons(r.History))
	}
	r = f.waitState("out-clean", core.StateSucceeded)
	if r.Fields["output_meta_decision"] != "allow" {
		t.Fatalf("clean: %v", r.Fields)
	}
}
