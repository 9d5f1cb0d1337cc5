// Package saga rolls workflows back: when a step fails fatally, the
// compensations recorded by the workflow's earlier successful steps run in
// reverse order (LIFO).
//
// Recording happens in the job's own atomic SUCCEEDED write: the template
// goes into the hash "<shard tag>saga:tmpl:<workflow_id>" of the job's shard
// and the job joins the sorted set "<shard tag>saga:stack:<workflow_id>" of
// the same shard (score = completion time), so a crash can never leave one
// without the other and the write stays on one Redis Cluster node. A
// workflow's stack is the union of those sets over the 64 shards, newest
// first. A FAILED_FATAL step adds its workflow to its shard's
// "<shard tag>saga:triggers" set in its FAILED write. Both writes also put
// the workflow in its shard's "<shard tag>saga:index" (index.go), which
// lists the kept sagas.
//
// Retention: the template is not kept on the step's record, which expires
// with the job retention (24 h by default), but next to the stack entry
// that refers to it. Both keys expire together, the saga retention
// (RetentionDefault unless configured) after the last step recorded in
// them; a rollback refreshes its workflow's keys when it starts and again
// when it finishes, so they expire the retention after its outcome. A step
// on another shard does not refresh them (no script leaves its slot): the
// retention must exceed the longest time from a workflow's step to a fatal
// failure of a later one.
package saga

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Key suffixes under a job's shard tag (see store.ShardZAdd).
const (
	// StackPrefix + workflow id: the shard's completed steps of a workflow
	// that carry a compensation. (Its own namespace: a workflow may be
	// called anything, "triggers" included.)
	StackPrefix = "saga:stack:"
	// TemplatesPrefix + workflow id: the compensation templates of the
	// workflow's steps on the shard's stack (see StepTemplateField), kept
	// and expiring with that stack.
	TemplatesPrefix = "saga:tmpl:"
	// Triggers: workflows of the shard whose rollback must run.
	Triggers = "saga:triggers"
	// TemplateField is the job record field where nodes of earlier versions
	// recorded the compensation template; a rollback still reads it when a
	// step's template is not in its workflow's templates hash.
	TemplateField = "comp"
)

// StepTemplateField is the field of a step's compensation template (a
// marshalled JobRequest) in its workflow's templates hash; the step's own
// topic is in the field "t:<job id>".
func StepTemplateField(jobID string) string { return "c:" + jobID }

func stepTopicField(jobID string) string { return "t:" + jobID }

// RecordStep adds a succeeded step's saga record to t, the step's
// SUCCEEDED write: its compensation template (and its own topic) to its
// workflow's templates hash and the step to its workflow's stack, both in
// the step's shard. Both keys expire retention (RetentionDefault when not
// positive) after this write, so a template lives exactly as long as the
// stack entry that refers to it.
func RecordStep(t *store.Transition, workflowID, jobID, topic string, tmpl []byte, nowMs int64, retention time.Duration) {
	ttl := retentionOr(retention)
	tk := TemplatesPrefix + workflowID
	t.Adds = append(t.Adds, store.ShardZAdd{Suffix: StackPrefix + workflowID, Score: nowMs, Member: jobID, TTL: ttl},
		indexAdd(workflowID, nowMs, ttl))
	t.Sets = append(t.Sets, store.ShardHSet{Suffix: tk, Field: StepTemplateField(jobID), Value: string(tmpl), TTL: ttl},
		store.ShardHSet{Suffix: tk, Field: stepTopicField(jobID), Value: topic, TTL: ttl})
}

// RecordTrigger adds a fatally failed step's trigger to t, the step's
// FAILED write: its workflow joins its shard's trigger set. The set expires
// retention after its newest trigger, and each trigger drops those older
// than retention: a rollback not finished that long after its trigger is
// given up.
func RecordTrigger(t *store.Transition, workflowID string, nowMs int64, retention time.Duration) {
	ttl := retentionOr(retention)
	t.Adds = append(t.Adds, store.ShardZAdd{Suffix: Triggers, Score: nowMs, Member: workflowID,
		TrimBelow: nowMs - ttl.Milliseconds(), TTL: ttl}, indexAdd(workflowID, nowMs, ttl))
}

func retentionOr(d time.Duration) time.Duration {
	if d <= 0 {
		return RetentionDefault
	}
	return d
}

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
