package troupe_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// A workflow step that succeeds records its compensation template and joins
// its workflow's stack in the same write as SUCCEEDED; a step that fails
// fatally triggers the workflow's rollback in the same write as FAILED.
func TestSagaRecordingIsPartOfTheTerminalWrite(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.startWorker("w1", true, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		if req.StepIndex == 2 {
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED_FATAL, ErrorCode: "boom"}
		}
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
	})
	step := func(id string, i int32) *capv1.JobRequest {
		r := echoReq(id)
		r.WorkflowId, r.StepIndex = "wf-1", i
		r.Compensation = &capv1.Compensation{Topic: "job.echo", Capability: "undo", Env: map[string]string{"UNDO": id}}
		return r
	}
	f.submit(step("wf1-s1", 1))
	f.waitState("wf1-s1", jobstate.StateSucceeded)
	keys := store.NewKeys(f.env.KeyPrefix())
	ctx := context.Background()
	raw, err := f.env.Redis.HGet(ctx, saga.TemplatesKey(keys, store.Shard("wf1-s1"), "wf-1"),
		saga.StepTemplateField("wf1-s1")).Bytes()
	if err != nil {
		t.Fatalf("template not recorded: %v", err)
	}
	tmpl := &capv1.JobRequest{}
	if err := proto.Unmarshal(raw, tmpl); err != nil {
		t.Fatalf("template: %v", err)
	}
	if tmpl.Priority != capv1.JobPriority_JOB_PRIORITY_CRITICAL || tmpl.Env["UNDO"] != "wf1-s1" ||
		tmpl.Meta.GetCapability() != "undo" || len(tmpl.Meta.GetIdempotencyKey()) != 64 || tmpl.Compensation != nil {
		t.Fatalf("template %v", tmpl)
	}
	stack := keys.Tag("wf1-s1") + saga.StackPrefix + "wf-1"
	if n, _ := f.env.Redis.ZScore(ctx, stack, "wf1-s1").Result(); n == 0 {
		t.Fatalf("step not on its workflow's stack %s", stack)
	}
	f.submit(step("wf1-s2", 2))
	rec := f.waitState("wf1-s2", jobstate.StateFailed)
	if rec.Reason != jobstate.ReasonWorkerFailedFatal {
		t.Fatalf("reason %s", rec.Reason)
	}
	if _, err := f.env.Redis.ZScore(ctx, keys.Tag("wf1-s2")+saga.Triggers, "wf-1").Result(); err != nil {
		t.Fatalf("rollback not triggered: %v", err)
	}
}

// The node's own saga runner rolls a workflow back: a fatal third step
// brings the compensations of steps 2 and 1, in that order, once each.
func TestNodeRollsAWorkflowBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) { c.Tuning.SagaPoll = 100 * time.Millisecond })
	comps := make(chan string, 10)
	f.startWorker("w1", true, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		if req.Labels[saga.LabelIsCompensation] == "true" {
			comps <- req.Env["UNDO"]
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
		}
		if req.StepIndex == 3 {
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED_FATAL}
		}
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
	})
	for i := int32(1); i <= 3; i++ {
		id := fmt.Sprintf("wfn-s%d", i)
		r := echoReq(id)
		r.WorkflowId, r.StepIndex = "wf-node", i
		r.Compensation = &capv1.Compensation{Topic: "job.echo", Env: map[string]string{"UNDO": id}}
		f.submit(r)
		want := jobstate.StateSucceeded
		if i == 3 {
			want = jobstate.StateFailed
		}
		f.waitState(id, want)
	}
	var got []string
	timeout := time.After(20 * time.Second)
	for len(got) < 2 {
		select {
		case id := <-comps:
			got = append(got, id)
		case <-timeout:
			t.Fatalf("compensations seen: %v", got)
		}
	}
	if got[0] != "wfn-s2" || got[1] != "wfn-s1" {
		t.Fatalf("compensations in order %v, want [wfn-s2 wfn-s1]", got)
	}
	select {
	case extra := <-comps:
		t.Fatalf("compensation dispatched again: %s", extra)
	case <-time.After(500 * time.Millisecond):
	}
	// The operators' view of it: GET /v1/sagas/{workflow}.
	addr := startAdmin(t, f.node, nil)
	var rep saga.Report
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(addr + "/v1/sagas/wf-node")
		if err != nil {
			t.Fatal(err)
		}
		_ = json.NewDecoder(resp.Body).Decode(&rep)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && rep.Progress != nil && rep.Progress.Status != "" && rep.Progress.Status != "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("saga report: %d %+v", resp.StatusCode, rep.Progress)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(rep.Steps) != 2 || rep.Steps[0].CompState != jobstate.StateSucceeded {
		t.Fatalf("saga report steps %+v", rep.Steps)
	}
	if resp, err := http.Get(addr + "/v1/sagas/no-such-workflow"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown workflow: %v %v", resp, err)
	}
}
