package saga

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// ReasonUnmarshalFailed is the DLQ reason of a compensation template that
// does not decode: the step cannot be compensated, the rollback goes on.
const ReasonUnmarshalFailed jobstate.Reason = "saga_unmarshal_failed"

// ProgressKey is the workflow's rollback progress hash
// ("<prefix>saga:<workflow_id>"): one field per step ("step:<job id>", a JSON
// StepProgress) plus the rollback's own fields (status, node, times). It is
// outside every shard tag because it is read and written by whichever
// replica holds the workflow's saga lock, never inside a job's script.
func ProgressKey(k *store.Keys, workflowID string) string {
	return k.Prefix() + "saga:progress:" + workflowID
}

// LockKey is the workflow's saga lock ("<prefix>saga:<workflow_id>:lock"):
// the replica that holds it is the only one running the rollback.
func LockKey(k *store.Keys, workflowID string) string { return k.Prefix() + "saga:lock:" + workflowID }

// StackKey is the workflow's stack on one shard.
func StackKey(k *store.Keys, shard int, workflowID string) string {
	return k.ShardTag(shard) + StackPrefix + workflowID
}

// TemplatesKey is the hash of compensation templates of the workflow's
// steps on one shard's stack (same shard tag: one step's write records both).
func TemplatesKey(k *store.Keys, shard int, workflowID string) string {
	return k.ShardTag(shard) + TemplatesPrefix + workflowID
}

// TriggersKey is one shard's set of workflows to roll back.
func TriggersKey(k *store.Keys, shard int) string { return k.ShardTag(shard) + Triggers }

// CompensationJobID is the job id of a step's compensation. It is a pure
// function of the workflow and the step (never a random uuid) so that a
// rollback resumed after a crash — by this node or another — submits the
// very same job again rather than a second one: the node absorbs a
// duplicate submit of a known job id (JetStream's duplicate window first,
// then the job actor, which ignores a submit of a live or finished job).
// That is what makes "dispatched at most once" hold across the window
// between publishing and recording that we published.
func CompensationJobID(workflowID, stepJobID string) string {
	sum := sha256.Sum256([]byte(workflowID + "|" + stepJobID))
	return "comp-" + hex.EncodeToString(sum[:])[:32]
}

// Step is one entry of a workflow's stack: a succeeded step that recorded
// a compensation.
type Step struct {
	JobID       string
	CompletedAt time.Time
	// Index is the step's step_index (from its template; -1 when the
	// template did not decode).
	Index int32
	// Topic is the step's own topic (recorded with its template).
	Topic string
	// Raw is the template as recorded; Template is it decoded, or nil with
	// DecodeErr set.
	Raw       []byte
	Template  *capv1.JobRequest
	DecodeErr error
}

// errNoTemplate: a step is on the stack but no template was found for it,
// neither in its workflow's templates hash nor (as nodes of earlier
// versions recorded it) on its record: the key was edited by hand, or its
// expiry was changed.
var errNoTemplate = errors.New("no compensation template recorded for the step")

// LoadStack reads a workflow's stack over every shard, newest first (the
// order a rollback runs in), with each step's template: two round trips.
// A stack key and its templates hash expire together (see RecordStep).
func LoadStack(ctx context.Context, st *store.Store, workflowID string) ([]Step, error) {
	rdb, keys := st.Client(), st.Keys()
	pipe := rdb.Pipeline()
	zs := make([]*redis.ZSliceCmd, store.Shards)
	for i := range zs {
		zs[i] = pipe.ZRangeWithScores(ctx, StackKey(keys, i, workflowID), 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("saga: read stack of %s: %w", workflowID, err)
	}
	var steps []Step
	for _, c := range zs {
		for _, z := range c.Val() {
			id, _ := z.Member.(string)
			steps = append(steps, Step{JobID: id, CompletedAt: time.UnixMilli(int64(z.Score)), Index: -1})
		}
	}
	if len(steps) == 0 {
		return nil, nil
	}
	pipe = rdb.Pipeline()
	hs := make([]*redis.SliceCmd, len(steps))
	legacy := make([]*redis.SliceCmd, len(steps))
	for i := range steps {
		id := steps[i].JobID
		hs[i] = pipe.HMGet(ctx, TemplatesKey(keys, store.Shard(id), workflowID), StepTemplateField(id), stepTopicField(id))
		legacy[i] = pipe.HMGet(ctx, keys.Job(id), TemplateField, "topic")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("saga: read templates of %s: %w", workflowID, err)
	}
	for i := range steps {
		s := &steps[i]
		v, old := hs[i].Val(), legacy[i].Val()
		raw, _ := v[0].(string)
		s.Topic, _ = v[1].(string)
		if raw == "" { // recorded by a node of an earlier version: on the step's record
			raw, _ = old[0].(string)
			s.Topic, _ = old[1].(string)
		}
		s.Raw = []byte(raw)
		if raw == "" {
			s.DecodeErr = errNoTemplate
			continue
		}
		t := &capv1.JobRequest{}
		if err := proto.Unmarshal(s.Raw, t); err != nil {
			s.DecodeErr = fmt.Errorf("decode template: %w", err)
			continue
		}
		s.Template, s.Index = t, t.StepIndex
	}
	// LIFO: newest completion first; steps completed in the same
	// millisecond fall back to their step index.
	sort.SliceStable(steps, func(a, b int) bool {
		if !steps[a].CompletedAt.Equal(steps[b].CompletedAt) {
			return steps[a].CompletedAt.After(steps[b].CompletedAt)
		}
		if steps[a].Index != steps[b].Index {
			return steps[a].Index > steps[b].Index
		}
		return steps[a].JobID > steps[b].JobID
	})
	return steps, nil
}

// StepOutcome is where a step's compensation is.
type StepOutcome string

// Step outcomes. Dispatching and Dispatched are in flight; the others are
// final, and a resumed rollback never touches a step that has one.
const (
	// OutcomeDispatching is written before the compensation is published.
	OutcomeDispatching StepOutcome = "dispatching"
	// OutcomeDispatched: published; the rollback waits for its end.
	OutcomeDispatched StepOutcome = "dispatched"
	OutcomeSucceeded  StepOutcome = "succeeded"
	// OutcomeFailed: the compensation job ended in another terminal state.
	OutcomeFailed StepOutcome = "failed"
	// OutcomeTimedOut: not terminal within the step budget.
	OutcomeTimedOut StepOutcome = "timed_out"
	// OutcomeDenied: the safety check denied it; it was not dispatched.
	OutcomeDenied StepOutcome = "denied"
	// OutcomeUnmarshalFailed: the template did not decode; dead-lettered.
	OutcomeUnmarshalFailed StepOutcome = "unmarshal_failed"
)

// Final reports whether o ends the step for good.
func (o StepOutcome) Final() bool {
	return o != "" && o != OutcomeDispatching && o != OutcomeDispatched
}

// StepProgress is one step's entry in the progress hash.
type StepProgress struct {
	Comp    string      `json:"comp,omitempty"`
	Outcome StepOutcome `json:"outcome"`
	// State is the compensation job's terminal state, when it had one.
	State jobstate.State `json:"state,omitempty"`
	// Detail says why: the denial reason, the decode error, the job's reason.
	Detail string `json:"detail,omitempty"`
	AtMs   int64  `json:"at_ms"`
}

// Status is a rollback's overall outcome.
type Status string

// Rollback statuses.
const (
	StatusRunning Status = "running"
	// StatusCompleted: every compensation succeeded.
	StatusCompleted Status = "completed"
	// StatusCompletedWithSkips: none failed, but some were not run
	// (denied, or their template did not decode).
	StatusCompletedWithSkips Status = "completed_with_skips"
	// StatusFailed: at least one compensation failed or ran out of budget.
	StatusFailed Status = "failed"
)

// Progress is a workflow's rollback as the progress hash records it.
type Progress struct {
	Status     Status
	Node       string
	Runs       int
	StartedAt  time.Time
	FinishedAt time.Time
	Duration   time.Duration
	Steps      map[string]StepProgress
}

// Progress hash fields besides the steps.
const (
	fieldStatus     = "status"
	fieldNode       = "node"
	fieldRuns       = "runs"
	fieldStarted    = "started_at"
	fieldFinished   = "finished_at"
	fieldDurationMs = "duration_ms"
	stepFieldPrefix = "step:"
)

// ReadProgress reads a workflow's rollback progress (empty, not an error,
// when no rollback ever started).
func ReadProgress(ctx context.Context, st *store.Store, workflowID string) (*Progress, error) {
	f, err := st.Client().HGetAll(ctx, ProgressKey(st.Keys(), workflowID)).Result()
	if err != nil {
		return nil, fmt.Errorf("saga: read progress of %s: %w", workflowID, err)
	}
	p := &Progress{Status: Status(f[fieldStatus]), Node: f[fieldNode], Steps: map[string]StepProgress{}}
	p.Runs, _ = strconv.Atoi(f[fieldRuns])
	p.StartedAt, p.FinishedAt = millis(f[fieldStarted]), millis(f[fieldFinished])
	if ms, err := strconv.ParseInt(f[fieldDurationMs], 10, 64); err == nil {
		p.Duration = time.Duration(ms) * time.Millisecond
	}
	for k, v := range f {
		id, ok := strings.CutPrefix(k, stepFieldPrefix)
		if !ok {
			continue
		}
		var sp StepProgress
		if err := json.Unmarshal([]byte(v), &sp); err != nil {
			sp = StepProgress{Detail: "unreadable progress entry: " + err.Error()}
		}
		p.Steps[id] = sp
	}
	return p, nil
}

func millis(s string) time.Time {
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil || ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// statusOf is the rollback's outcome over its steps' outcomes.
func statusOf(p map[string]StepProgress) Status {
	s := StatusCompleted
	for _, sp := range p {
		switch sp.Outcome {
		case OutcomeFailed, OutcomeTimedOut:
			return StatusFailed
		case OutcomeDenied, OutcomeUnmarshalFailed:
			s = StatusCompletedWithSkips
		}
	}
	return s
}
