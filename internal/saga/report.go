package saga

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// Report is a workflow's saga as an operator sees it (`troupe saga`): the
// stack newest first, with each step's compensation and its job's state
// now, and the rollback's progress.
type Report struct {
	WorkflowID string
	Progress   *Progress
	Steps      []ReportStep
	// Triggered: the workflow is in a trigger set (a rollback is due or
	// running).
	Triggered bool
	// LockHolder is the saga lock's value ("<node>|<token>"), empty when free.
	LockHolder string
}

// ReportStep is one stack entry with its compensation.
type ReportStep struct {
	Step
	// CompJobID is the compensation's job id (known before it is dispatched).
	CompJobID string
	Progress  StepProgress
	// CompState is the compensation job's state now ("" when it has no record).
	CompState jobstate.State
}

// Describe gathers a workflow's Report: four round trips.
func Describe(ctx context.Context, st *store.Store, workflowID string) (*Report, error) {
	steps, err := LoadStack(ctx, st, workflowID)
	if err != nil {
		return nil, err
	}
	prog, err := ReadProgress(ctx, st, workflowID)
	if err != nil {
		return nil, err
	}
	rdb, keys := st.Client(), st.Keys()
	pipe := rdb.Pipeline()
	trig := make([]*redis.FloatCmd, store.Shards)
	for i := range trig {
		trig[i] = pipe.ZScore(ctx, TriggersKey(keys, i), workflowID)
	}
	lock := pipe.Get(ctx, LockKey(keys, workflowID))
	states := make([]*redis.StringCmd, len(steps))
	rep := &Report{WorkflowID: workflowID, Progress: prog}
	for i, s := range steps {
		comp := CompensationJobID(workflowID, s.JobID)
		if p, ok := prog.Steps[s.JobID]; ok && p.Comp != "" {
			comp = p.Comp
		} else if ok && p.Outcome == OutcomeUnmarshalFailed {
			comp = "" // never built: there was no template to build it from
		}
		rep.Steps = append(rep.Steps, ReportStep{Step: s, CompJobID: comp, Progress: prog.Steps[s.JobID]})
		states[i] = pipe.HGet(ctx, keys.Job(comp), "s") // "job:" with no id when comp is empty: no record
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return nil, fmt.Errorf("saga: describe %s: %w", workflowID, err)
	}
	for _, c := range trig {
		if c.Err() == nil {
			rep.Triggered = true
		}
	}
	rep.LockHolder = lock.Val()
	for i := range rep.Steps {
		rep.Steps[i].CompState = jobstate.State(states[i].Val())
	}
	return rep, nil
}
