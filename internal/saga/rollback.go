package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

var (
	// errLockHeld: another runner holds the workflow's saga lock; it is
	// doing the work, nothing to report.
	errLockHeld = errors.New("saga: workflow lock held by another runner")
	// errLockLost: the lock could not be renewed (it expired, or another
	// runner took it); the rollback stops at once and leaves the rest to
	// the holder.
	errLockLost = errors.New("saga: workflow lock lost")
	// errBudget: a compensation was not terminal within the step budget.
	errBudget = errors.New("saga: step budget exhausted")
)

// rollback is one run of a workflow's rollback, on the goroutine its saga
// actor started. Every field is immutable; the run's state is on its stack
// and in Redis.
type rollback struct {
	rt     *runtime
	wf     string
	upToMs int64
	log    *slog.Logger
}

// run takes the workflow's lock, compensates every step not yet
// compensated (newest first), records the outcome and clears the
// workflow's triggers. An error means the run stopped midway; the
// progress hash says how far it got and the trigger is left set, so the
// next poll resumes it.
func (r *rollback) run(ctx context.Context) (Status, error) {
	cfg := r.rt.cfg
	rdb, keys := cfg.Store.Client(), cfg.Store.Keys()
	lockKey, token := LockKey(keys, r.wf), lockToken(cfg.NodeID)
	lctx, cancel := context.WithTimeout(ctx, redisTimeout)
	ok, err := takeLock(lctx, rdb, lockKey, token, cfg.LockTTL)
	cancel()
	if err != nil {
		return "", fmt.Errorf("saga: take lock of %s: %w", r.wf, err)
	}
	if !ok {
		return "", errLockHeld
	}
	defer releaseLock(rdb, lockKey, token)
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go r.keepLock(ctx, stop, lockKey, token)

	r.rt.m.active.Inc()
	defer r.rt.m.active.Dec()
	r.rt.m.triggered.Inc()
	prog, err := ReadProgress(ctx, cfg.Store, r.wf)
	if err != nil {
		return "", err
	}
	now := time.Now()
	started := prog.StartedAt
	if started.IsZero() || (prog.Status != "" && prog.Status != StatusRunning) {
		started = now // a fresh rollback, or a new round after one that finished
	}
	pkey := ProgressKey(keys, r.wf)
	pipe := rdb.TxPipeline()
	pipe.HSet(ctx, pkey, fieldStatus, string(StatusRunning), fieldNode, cfg.NodeID,
		fieldStarted, started.UnixMilli())
	pipe.HIncrBy(ctx, pkey, fieldRuns, 1)
	pipe.PExpire(ctx, pkey, cfg.Retention)
	if _, err := pipe.Exec(ctx); err != nil {
		return "", fmt.Errorf("saga: record start of %s: %w", r.wf, err)
	}
	steps, err := LoadStack(ctx, cfg.Store, r.wf)
	if err != nil {
		return "", err
	}
	// The stack must outlive this run, however long after its last step
	// the workflow failed.
	if err := r.keep(ctx, steps); err != nil {
		return "", err
	}
	r.log.Info("saga: rollback started", "steps", len(steps), "run", prog.Runs+1)
	for i := range steps {
		if err := context.Cause(ctx); err != nil {
			return "", err
		}
		prev := prog.Steps[steps[i].JobID]
		if prev.Outcome.Final() {
			continue // compensated (or skipped) by an earlier run
		}
		sp, err := r.compensate(ctx, &steps[i], prev)
		if err != nil {
			if c := context.Cause(ctx); c != nil {
				err = c
			}
			return "", err
		}
		prog.Steps[steps[i].JobID] = sp
	}

	status := statusOf(prog.Steps)
	fin := time.Now()
	pipe = rdb.TxPipeline()
	pipe.HSet(ctx, pkey, fieldStatus, string(status), fieldFinished, fin.UnixMilli(),
		fieldDurationMs, fin.Sub(started).Milliseconds())
	pipe.PExpire(ctx, pkey, cfg.Retention)
	if _, err := pipe.Exec(ctx); err != nil {
		return "", fmt.Errorf("saga: record outcome of %s: %w", r.wf, err)
	}
	if err := r.keep(ctx, steps); err != nil {
		// They expire Retention after this run's start instead.
		r.log.Warn("saga: refreshing retention failed", "err", err)
	}
	r.rt.m.duration.Observe(fin.Sub(started).Seconds())
	if err := r.dropTriggers(ctx); err != nil {
		// The outcome is recorded; the next poll runs an empty round.
		r.log.Warn("saga: clearing triggers failed", "err", err)
	}
	return status, nil
}

// keep sets the stack and templates hash of every shard the workflow's
// steps are on to expire Retention from now (the progress hash gets it with
// each write).
func (r *rollback) keep(ctx context.Context, steps []Step) error {
	cfg := r.rt.cfg
	keys := cfg.Store.Keys()
	pipe := cfg.Store.Client().Pipeline()
	seen := map[int]bool{}
	for _, s := range steps {
		sh := store.Shard(s.JobID)
		if seen[sh] {
			continue
		}
		seen[sh] = true
		pipe.PExpire(ctx, StackKey(keys, sh, r.wf), cfg.Retention)
		pipe.PExpire(ctx, TemplatesKey(keys, sh, r.wf), cfg.Retention)
	}
	if len(seen) == 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	if _, err := pipe.Exec(wctx); err != nil {
		return fmt.Errorf("saga: refresh retention of %s: %w", r.wf, err)
	}
	return nil
}

// keepLock renews the workflow lock every third of its TTL until ctx ends,
// and cancels the run when the lock is no longer ours.
func (r *rollback) keepLock(ctx context.Context, stop context.CancelCauseFunc, key, token string) {
	cfg := r.rt.cfg
	t := time.NewTicker(cfg.LockTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, redisTimeout)
			ok, err := renewLock(rctx, cfg.Store.Client(), key, token, cfg.LockTTL)
			cancel()
			switch {
			case err != nil:
				// Two more tries before the TTL runs out.
				r.log.Warn("saga: lock renewal failed", "err", err)
			case !ok:
				stop(errLockLost)
				return
			}
		}
	}
}

// compensate runs one step's compensation to a final outcome, recording
// it before and after the dispatch. It returns an error only when the run
// must stop (the context ended, Redis or NATS failed); the step is then
// resumed by the next run.
func (r *rollback) compensate(ctx context.Context, step *Step, prev StepProgress) (StepProgress, error) {
	cfg, m := r.rt.cfg, r.rt.m
	if prev.Outcome == "" {
		m.recorded.Inc()
	}
	log := r.log.With("step_job_id", step.JobID)
	if step.Template == nil {
		entry := &store.DLQEntry{JobID: step.JobID, Topic: step.Topic, Reason: ReasonUnmarshalFailed,
			Message: fmt.Sprintf("workflow %s: compensation template: %v", r.wf, step.DecodeErr), Raw: step.Raw}
		if err := cfg.Store.AddDLQ(ctx, entry); err != nil {
			return StepProgress{}, err
		}
		r.announceDLQ(entry)
		m.unmarshal.Inc()
		m.skipped.WithLabelValues(string(OutcomeUnmarshalFailed)).Inc()
		log.Warn("saga: compensation template does not decode; dead-lettered", "err", step.DecodeErr)
		return r.record(ctx, step.JobID, StepProgress{Outcome: OutcomeUnmarshalFailed, Detail: step.DecodeErr.Error()})
	}
	compID := CompensationJobID(r.wf, step.JobID)
	req := r.build(step.Template, compID)
	log = log.With("job_id", compID, "topic", req.Topic)
	switch prev.Outcome {
	case "":
		if denied, why := r.denied(ctx, req); denied {
			m.skipped.WithLabelValues(string(OutcomeDenied)).Inc()
			log.Warn("saga: compensation denied by policy; skipped", "reason", why)
			return r.record(ctx, step.JobID, StepProgress{Comp: compID, Outcome: OutcomeDenied, Detail: why})
		}
		if _, err := r.record(ctx, step.JobID, StepProgress{Comp: compID, Outcome: OutcomeDispatching}); err != nil {
			return StepProgress{}, err
		}
		if err := r.publish(ctx, req); err != nil {
			return StepProgress{}, err
		}
	default:
		// An earlier run wrote "dispatching" (and perhaps published) or
		// "dispatched". If the job has a record, the node has it: just
		// wait. If not, publish the same job again — whether the earlier
		// publish happened or not, the node keeps one job per id.
		exists, err := r.jobExists(ctx, compID)
		if err != nil {
			return StepProgress{}, err
		}
		if !exists {
			if err := r.publish(ctx, req); err != nil {
				return StepProgress{}, err
			}
		}
		log.Info("saga: resuming a dispatched compensation", "republished", !exists)
	}
	if prev.Outcome != OutcomeDispatched {
		if _, err := r.record(ctx, step.JobID, StepProgress{Comp: compID, Outcome: OutcomeDispatched}); err != nil {
			return StepProgress{}, err
		}
	}
	state, reason, err := r.await(ctx, compID, safety.TenantOf(req), req.GetMeta().GetIdempotencyKey())
	sp := StepProgress{Comp: compID, State: state, Detail: string(reason)}
	switch {
	case errors.Is(err, errBudget):
		sp.Outcome, sp.Detail = OutcomeTimedOut, fmt.Sprintf("not terminal within %s (last state %q)", cfg.StepBudget, state)
		sp.State = ""
	case err != nil:
		return StepProgress{}, err
	case state == jobstate.StateSucceeded:
		sp.Outcome = OutcomeSucceeded
	default:
		sp.Outcome = OutcomeFailed
	}
	if sp.Outcome != OutcomeSucceeded {
		m.failed.Inc()
		log.Warn("saga: compensation did not succeed", "outcome", sp.Outcome, "state", state, "reason", reason)
	}
	return r.record(ctx, step.JobID, sp)
}

// announceDLQ tells sys.job.dlq subscribers about a dead-lettered step, as
// the job actor does for its own DLQ entries. Best effort: the entry in
// Redis is the record.
func (r *rollback) announceDLQ(e *store.DLQEntry) {
	cfg := r.rt.cfg
	data, err := bus.EncodeResult(e.JobID, "troupe-saga/"+cfg.NodeID, &capv1.JobResult{JobId: e.JobID,
		Status: capv1.JobStatus_JOB_STATUS_FAILED, ErrorCode: string(e.Reason), ErrorMessage: e.Message})
	if err == nil {
		err = cfg.JS.Conn().Publish(cfg.Subjects.DLQ, data)
	}
	if err != nil {
		r.log.Warn("saga: dlq publish failed", "step_job_id", e.JobID, "err", err)
	}
}

// build makes the compensation job from its template: the deterministic
// job id and the labels (and env entries) that mark it as a compensation
// of this workflow.
func (r *rollback) build(t *capv1.JobRequest, compID string) *capv1.JobRequest {
	req := proto.Clone(t).(*capv1.JobRequest)
	req.JobId = compID
	if req.Labels == nil {
		req.Labels = map[string]string{}
	}
	if req.Env == nil {
		req.Env = map[string]string{}
	}
	for _, kv := range [][2]string{{LabelCompensation, "true"}, {LabelIsCompensation, "true"}, {LabelWorkflow, r.wf}} {
		req.Labels[kv[0]], req.Env[kv[0]] = kv[1], kv[1]
	}
	return req
}

// denied runs the soft safety check: only an explicit DENY stops a
// compensation. An unavailable kernel, an error or a timeout lets it
// proceed — undoing a workflow's effects is worth more than a check we
// could not make, and the node's own policy still sees the job.
func (r *rollback) denied(ctx context.Context, req *capv1.JobRequest) (bool, string) {
	p := r.rt.cfg.Policy
	if p == nil {
		return false, ""
	}
	cctx, cancel := context.WithTimeout(ctx, r.rt.cfg.PolicyTimeout)
	defer cancel()
	resp, err := p.Check(cctx, safety.CheckRequest(req))
	if err != nil {
		r.log.Warn("saga: safety check unavailable; compensation proceeds", "job_id", req.JobId,
			"topic", req.Topic, "unavailable", errors.Is(err, safety.ErrUnavailable), "err", err)
		return false, ""
	}
	if resp.GetDecision() == capv1.DecisionType_DECISION_TYPE_DENY {
		why := resp.GetReason()
		if rule := resp.GetRuleId(); rule != "" {
			why += " (rule " + rule + ")"
		}
		return true, why
	}
	return false, ""
}

// publish submits the compensation on the submit subject. The JetStream
// message id is the job id, so a publish repeated within the stream's
// duplicate window is dropped by JetStream itself.
func (r *rollback) publish(ctx context.Context, req *capv1.JobRequest) error {
	cfg := r.rt.cfg
	data, err := bus.EncodeRequest(req.JobId, "troupe-saga/"+cfg.NodeID, req)
	if err != nil {
		return fmt.Errorf("saga: encode compensation %s: %w", req.JobId, err)
	}
	pctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	if _, err := cfg.JS.Publish(pctx, cfg.Subjects.Submit, data, jetstream.WithMsgID(req.JobId)); err != nil {
		return fmt.Errorf("saga: publish compensation %s: %w", req.JobId, err)
	}
	r.rt.m.dispatched.Inc()
	return nil
}

func (r *rollback) jobExists(ctx context.Context, jobID string) (bool, error) {
	n, err := r.rt.cfg.Store.Client().Exists(ctx, r.rt.cfg.Store.Keys().Job(jobID)).Result()
	if err != nil {
		return false, fmt.Errorf("saga: read job %s: %w", jobID, err)
	}
	return n == 1, nil
}

// await polls the compensation's state until it is terminal, the step
// budget runs out (errBudget, with the last state seen) or ctx ends. A job
// whose idempotency key another job already holds never gets a record of
// its own: the holder is then the compensation, and is followed.
func (r *rollback) await(ctx context.Context, jobID, tenant, idemKey string) (jobstate.State, jobstate.Reason, error) {
	cfg := r.rt.cfg
	rdb, keys := cfg.Store.Client(), cfg.Store.Keys()
	budget := time.NewTimer(cfg.StepBudget)
	defer budget.Stop()
	tick := time.NewTicker(cfg.JobPoll)
	defer tick.Stop()
	var last jobstate.State
	for {
		v, err := rdb.HMGet(ctx, keys.Job(jobID), "s", "reason").Result()
		if err == nil {
			s, _ := v[0].(string)
			reason, _ := v[1].(string)
			last = jobstate.State(s)
			if last.Terminal() {
				return last, jobstate.Reason(reason), nil
			}
			if s == "" && idemKey != "" {
				if holder, err := rdb.Get(ctx, keys.Idempotency(tenant, idemKey)).Result(); err == nil &&
					holder != "" && holder != jobID {
					r.log.Info("saga: compensation is an idempotent duplicate; following the holder",
						"job_id", jobID, "holder", holder)
					jobID = holder
				}
			}
		} else if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
			r.log.Debug("saga: compensation state read failed", "job_id", jobID, "err", err)
		}
		select {
		case <-ctx.Done():
			return last, "", ctx.Err()
		case <-budget.C:
			return last, "", errBudget
		case <-tick.C:
		}
	}
}

// record writes one step's progress entry.
func (r *rollback) record(ctx context.Context, stepJobID string, sp StepProgress) (StepProgress, error) {
	sp.AtMs = time.Now().UnixMilli()
	b, err := json.Marshal(sp)
	if err != nil {
		return sp, fmt.Errorf("saga: encode progress: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	key := ProgressKey(r.rt.cfg.Store.Keys(), r.wf)
	pipe := r.rt.cfg.Store.Client().TxPipeline()
	pipe.HSet(wctx, key, stepFieldPrefix+stepJobID, b)
	pipe.PExpire(wctx, key, r.rt.cfg.Retention)
	if _, err := pipe.Exec(wctx); err != nil {
		return sp, fmt.Errorf("saga: record progress of %s/%s: %w", r.wf, stepJobID, err)
	}
	return sp, nil
}

// dropTriggers clears the workflow from every shard's trigger set, up to
// the newest trigger this run was started for.
func (r *rollback) dropTriggers(ctx context.Context) error {
	rdb, keys := r.rt.cfg.Store.Client(), r.rt.cfg.Store.Keys()
	pipe := rdb.Pipeline()
	for i := 0; i < store.Shards; i++ {
		dropTriggerScript.Eval(ctx, pipe, []string{TriggersKey(keys, i)}, r.wf, r.upToMs)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("saga: clear triggers of %s: %w", r.wf, err)
	}
	return nil
}
