package troupe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/intake"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// What the dashboard's actions need beyond node_admin.go: the retry of a
// finished job, pausing a topic, and the list of sagas.

// labelRetryOf is the label a retried job carries: the id of the job it
// re-runs.
const labelRetryOf = "retry_of"

// RetryJob submits a finished job again under a new id, "<job_id>-retry<N>",
// with the same request (minus its idempotency key, which would make the
// retry a duplicate) and the label retry_of=<job_id>, and links the two
// jobs (JobLinks). A job not ended, or ended in a state core.State.Retryable
// refuses, is store.ErrNotRetryable.
func (n inspector) RetryJob(ctx context.Context, jobID string) (string, error) {
	rec, err := n.store.GetJob(ctx, jobID)
	if err != nil {
		return "", err
	}
	if !rec.State.Retryable() {
		return "", fmt.Errorf("%w: job %s is %s", store.ErrNotRetryable, jobID, rec.State)
	}
	req := &capv1.JobRequest{}
	if len(rec.Request) == 0 || proto.Unmarshal(rec.Request, req) != nil {
		return "", fmt.Errorf("%w: job %s has no usable request recorded", store.ErrNotRetryable, jobID)
	}
	seq, err := n.store.NextRetryNumber(ctx, jobID)
	if err != nil {
		return "", err
	}
	newID := jobID + "-retry" + strconv.FormatInt(seq, 10)
	if intake.ValidateJobID(newID) != nil {
		var b [8]byte
		_, _ = rand.Read(b[:])
		newID = "retry-" + hex.EncodeToString(b[:])
	}
	req.JobId = newID
	if req.Meta != nil {
		req.Meta.IdempotencyKey = ""
	}
	if req.Labels == nil {
		req.Labels = map[string]string{}
	}
	req.Labels[labelRetryOf] = jobID
	if err := n.Submit(ctx, req); err != nil {
		return "", fmt.Errorf("troupe: retry %s: submit: %w", jobID, err)
	}
	if err := n.store.LinkRetry(ctx, jobID, newID, ""); err != nil {
		return newID, fmt.Errorf("troupe: retry %s submitted as %s but not linked: %w", jobID, newID, err)
	}
	return newID, nil
}

// PauseTopic stops dispatching topic's jobs on every replica until
// ResumeTopic; they wait SCHEDULED pool_paused (router.MappingStore.Pause).
// This node applies it before returning, the other replicas within
// router.PoolsPollDefault.
func (n inspector) PauseTopic(ctx context.Context, topic string) error {
	if err := n.Mappings().Pause(ctx, topic); err != nil {
		return err
	}
	n.applyPools()
	return nil
}

// ResumeTopic dispatches topic's jobs again, the waiting ones in order;
// applied as PauseTopic is.
func (n inspector) ResumeTopic(ctx context.Context, topic string) error {
	if err := n.Mappings().Resume(ctx, topic); err != nil {
		return err
	}
	n.applyPools()
	return nil
}

// applyPools reloads the runtime mappings now rather than at the next poll
// (a pools file that fails to parse keeps its last good version, as on any
// reload, and is logged there).
func (n *Node) applyPools() { _ = n.pools.Reload() }

// ListSagas lists the workflows whose sagas are kept, newest first
// (saga.List).
func (n inspector) ListSagas(ctx context.Context, limit int, cursor string) ([]saga.Listed, string, error) {
	return saga.List(ctx, n.store, limit, cursor)
}
