// Package saga rolls workflows back: when a step fails fatally, the
// compensations recorded by the workflow's earlier successful steps run in
// reverse order (LIFO).
//
// Recording happens in the job's own atomic SUCCEEDED write: the template is
// a field of the job's record and the job joins the sorted set
// "<shard tag>saga:stack:<workflow_id>" of its shard (score = completion time), so a
// crash can never leave one without the other and the write stays on one
// Redis Cluster node. A workflow's stack is the union of those sets over the
// 64 shards, newest first. A FAILED_FATAL step adds its workflow to its
// shard's "<shard tag>saga:triggers" set in its FAILED write.
package saga

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/proto/capv1"
)

// Key suffixes under a job's shard tag (see store.ShardZAdd).
const (
	// StackPrefix + workflow id: the shard's completed steps of a workflow
	// that carry a compensation. (Its own namespace: a workflow may be
	// called anything, "triggers" included.)
	StackPrefix = "saga:stack:"
	// Triggers: workflows of the shard whose rollback must run.
	Triggers = "saga:triggers"
	// TemplateField is the job record field holding the compensation
	// template (a marshalled JobRequest).
	TemplateField = "comp"
)

// Labels and env entries every compensation job carries.
const (
	LabelCompensation   = "saga_compensation"
	LabelIsCompensation = "is_compensation"
	LabelWorkflow       = "saga_workflow_id"
)

// Template builds the compensation job for a succeeded step: the original
// request with the Compensation's overrides, priority CRITICAL, and an
// idempotency key sha256(workflow_id|job_id|topic|capability|step_index)
// unless the compensation's labels or the request set one. It returns nil
// when the request has no compensation or no workflow.
func Template(req *capv1.JobRequest) *capv1.JobRequest {
	comp := req.GetCompensation()
	if comp == nil || req.GetWorkflowId() == "" {
		return nil
	}
	t := proto.Clone(req).(*capv1.JobRequest)
	t.Compensation = nil
	t.Priority = capv1.JobPriority_JOB_PRIORITY_CRITICAL
	if comp.Topic != "" {
		t.Topic = comp.Topic
	}
	if comp.ContextPtr != "" {
		t.ContextPtr = comp.ContextPtr
	}
	if comp.Priority != capv1.JobPriority_JOB_PRIORITY_UNSPECIFIED {
		t.Priority = comp.Priority
	}
	if comp.Budget != nil {
		t.Budget = proto.Clone(comp.Budget).(*capv1.Budget)
	}
	if len(comp.Env) > 0 {
		if t.Env == nil {
			t.Env = map[string]string{}
		}
		maps.Copy(t.Env, comp.Env)
	}
	if len(comp.Labels) > 0 {
		if t.Labels == nil {
			t.Labels = map[string]string{}
		}
		maps.Copy(t.Labels, comp.Labels)
	}
	if t.Meta == nil {
		t.Meta = &capv1.JobMetadata{}
	}
	if comp.Capability != "" {
		t.Meta.Capability = comp.Capability
	}
	if t.Meta.IdempotencyKey == "" || t.Meta.IdempotencyKey == req.GetMeta().GetIdempotencyKey() {
		sum := sha256.Sum256([]byte(req.WorkflowId + "|" + req.JobId + "|" + t.Topic + "|" + t.Meta.Capability +
			"|" + strconv.Itoa(int(req.StepIndex))))
		t.Meta.IdempotencyKey = hex.EncodeToString(sum[:])
	}
	t.ParentJobId = req.JobId
	return t
}
