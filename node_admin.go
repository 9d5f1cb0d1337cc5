package troupe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/intake"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/jobtrace"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The operators' side of a node: what the admin API (package admin) and
// the dashboard need beyond submitting and reading jobs. Every method is
// valid after Start.

// ErrNotStarted is returned by Ready before Start.
var ErrNotStarted = errors.New("troupe: node not started")

// ListJobs returns one page of the jobs in q.State, newest update first;
// with no state, of the newest jobs of every state (store.ListRecent).
func (n inspector) ListJobs(ctx context.Context, q store.ListQuery) (store.JobPage, error) {
	if q.State == "" {
		return n.store.ListRecent(ctx, q)
	}
	return n.store.ListJobs(ctx, q)
}

// CountStates returns how many jobs each of states (none: every state)
// holds (terminal states count the jobs still retained). SCHEDULED includes
// the jobs waiting with no record yet (SubmitsWaiting): it counts every job
// whose submit was acknowledged and that is not yet dispatched or ended.
func (n inspector) CountStates(ctx context.Context, states ...jobstate.State) (map[jobstate.State]int64, error) {
	counts, err := n.store.CountStates(ctx, states...)
	if err != nil {
		return nil, err
	}
	if _, scheduled := counts[jobstate.StateScheduled]; !scheduled {
		return counts, nil
	}
	if held, taken, err := n.SubmitsWaiting(ctx); err == nil {
		counts[jobstate.StateScheduled] += held + taken
	} else {
		n.log.Debug("stats: submit consumer unread; waits with no record left out", "err", err)
	}
	return counts, nil
}

// SubmitsWaiting counts, across every replica, the jobs whose submit was
// acknowledged to the client and that have no record yet: held are still
// in the submit stream, not yet taken by any node (its back-pressure,
// MaxAdmitting); taken are taken by a node and not yet acked — waiting for
// room within their capacity grace, or being decided. One JetStream
// request (the submit consumer's info): each submit is counted once, by
// the stream, not by the nodes.
func (n inspector) SubmitsWaiting(ctx context.Context) (held, taken int64, err error) {
	cons, err := n.js.Consumer(ctx, bus.StreamName(n.cfg.StreamPrefix, bus.StreamSubmit), bus.ConsumerName(bus.StreamSubmit))
	if err != nil {
		return 0, 0, fmt.Errorf("troupe: submit consumer: %w", err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("troupe: submit consumer info: %w", err)
	}
	return int64(info.NumPending), int64(info.NumAckPending), nil
}

// JobTenants returns the tenant of each job that has a record.
func (n inspector) JobTenants(ctx context.Context, jobIDs []string) (map[string]string, error) {
	return n.store.Tenants(ctx, jobIDs)
}

// JobLinks returns a job's retry links.
func (n inspector) JobLinks(ctx context.Context, jobID string) (store.JobLinks, error) {
	return n.store.Links(ctx, jobID)
}

// ListDLQ returns up to limit DLQ entries, newest first.
func (n inspector) ListDLQ(ctx context.Context, limit int64) ([]store.DLQEntry, error) {
	return n.store.ListDLQ(ctx, limit)
}

// DLQEntry returns one DLQ entry (store.ErrDLQNotFound if there is none).
func (n inspector) DLQEntry(ctx context.Context, entryID string) (*store.DLQEntry, error) {
	return n.store.DLQEntryByID(ctx, entryID)
}

// DLQRetried returns, for the given entries, the jobs they were retried as.
func (n inspector) DLQRetried(ctx context.Context, entryIDs []string) (map[string]string, error) {
	return n.store.DLQRetriedMany(ctx, entryIDs)
}

// DeleteDLQ removes a DLQ entry.
func (n inspector) DeleteDLQ(ctx context.Context, entryID string) error {
	return n.store.DeleteDLQ(ctx, entryID)
}

// RetryDLQ re-submits the job of a DLQ entry under a new id,
// "<job_id>-retry<N>", and links the two jobs (JobLinks). The request is
// the one recorded with the original job, minus its idempotency key: the
// key would make the retry a duplicate of the job it retries. An entry is
// retried once; force retries it again.
func (n inspector) RetryDLQ(ctx context.Context, entryID string, force bool) (string, error) {
	e, err := n.store.DLQEntryByID(ctx, entryID)
	if err != nil {
		return "", err
	}
	if e.JobID == "" {
		return "", fmt.Errorf("%w: entry %s is an input that never became a job (%s)", store.ErrNotRetryable, entryID, e.Reason)
	}
	rec, err := n.store.GetJob(ctx, e.JobID)
	if errors.Is(err, store.ErrNotFound) {
		return "", fmt.Errorf("%w: job %s has no record any more", store.ErrNotRetryable, e.JobID)
	}
	if err != nil {
		return "", err
	}
	req := &capv1.JobRequest{}
	if len(rec.Request) == 0 || proto.Unmarshal(rec.Request, req) != nil {
		return "", fmt.Errorf("%w: job %s has no usable request recorded", store.ErrNotRetryable, e.JobID)
	}
	if !force {
		// Refuse a known second retry before it costs a retry number; the
		// claim below still settles a race between two first retries.
		if prev, err := n.store.DLQRetried(ctx, entryID); err != nil {
			return "", err
		} else if prev != "" {
			return "", fmt.Errorf("%w as %s", store.ErrAlreadyRetried, prev)
		}
	}
	seq, err := n.store.NextRetryNumber(ctx, e.JobID)
	if err != nil {
		return "", err
	}
	newID := e.JobID + "-retry" + strconv.FormatInt(seq, 10)
	if intake.ValidateJobID(newID) != nil {
		// Too long with the suffix: a fresh id, linked all the same.
		var b [8]byte
		_, _ = rand.Read(b[:])
		newID = "retry-" + hex.EncodeToString(b[:])
	}
	if err := n.store.ClaimDLQRetry(ctx, entryID, newID, force); err != nil {
		return "", err
	}
	req.JobId = newID
	if req.Meta != nil {
		req.Meta.IdempotencyKey = ""
	}
	if err := n.Submit(ctx, req); err != nil {
		_ = n.store.ReleaseDLQRetry(context.WithoutCancel(ctx), entryID, newID)
		return "", fmt.Errorf("troupe: retry %s: submit: %w", e.JobID, err)
	}
	if err := n.store.LinkRetry(ctx, e.JobID, newID, entryID); err != nil {
		return newID, fmt.Errorf("troupe: retry %s submitted as %s but not linked: %w", e.JobID, newID, err)
	}
	return newID, nil
}

// PoolConfig returns the routing config in force: pools.yaml (or
// Config.Pools) with the runtime mappings laid over it.
func (n inspector) PoolConfig() *router.PoolConfig { return n.pools.Current() }

// JobTraceEnabled reports whether this node traces its job actors' mailboxes.
func (n inspector) JobTraceEnabled() bool { return jobtrace.FromSystem(n.sys) != nil }

// JobTrace returns a job's mailbox trace, oldest first: what was persisted
// when its actors stopped (on any replica), and, when the job's actor is
// live on this node and tracing is on here, its ring so far.
func (n inspector) JobTrace(ctx context.Context, jobID string) ([]jobtrace.Entry, error) {
	if t := jobtrace.FromSystem(n.sys); t != nil {
		return t.Trace(ctx, jobID)
	}
	return jobtrace.Load(ctx, n.rdb, n.store.Keys(), jobID)
}

// Readiness check names, as NotReadyError reports them.
const (
	ReadyNATS     = "nats"
	ReadyStreams  = "streams"
	ReadyRedis    = "redis"
	ReadyRegistry = "registry"
)

// readyRouterTimeout bounds the router's answer; it answers from memory, so
// a second means it is wedged or its mailbox is flooded.
const readyRouterTimeout = time.Second

// NotReadyError lists the readiness checks that failed and why.
type NotReadyError struct {
	Checks map[string]error
}

func (e *NotReadyError) Error() string {
	names := make([]string, 0, len(e.Checks))
	for k := range e.Checks {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = k + ": " + e.Checks[k].Error()
	}
	return "troupe: not ready: " + strings.Join(parts, "; ")
}

// FailedChecks returns each failed check's reason as text.
func (e *NotReadyError) FailedChecks() map[string]string {
	out := make(map[string]string, len(e.Checks))
	for k, err := range e.Checks {
		out[k] = err.Error()
	}
	return out
}

// Ready reports whether the node can do its work: NATS connected, the three
// JetStream streams and their consumers present (a running node recreates
// missing ones within bus.StreamCheckEvery plus bus.RecreateSettleDefault)
// and none refusing the stream keeper's last write probe, Redis answering,
// and the worker registry (the router actor) answering after its warm
// start. It returns nil or a
// *NotReadyError; the checks run concurrently, each bounded by ctx.
func (n *Node) Ready(ctx context.Context) error {
	if n.sys == nil || n.nc == nil || n.store == nil {
		return ErrNotStarted
	}
	checks := map[string]func(context.Context) error{
		ReadyNATS: func(context.Context) error {
			if st := n.nc.Status(); st != nats.CONNECTED {
				return fmt.Errorf("connection %s", st)
			}
			return nil
		},
		ReadyStreams: func(ctx context.Context) error {
			for _, k := range []bus.StreamKind{bus.StreamSubmit, bus.StreamResult, bus.StreamCancel} {
				name := bus.StreamName(n.cfg.StreamPrefix, k)
				if _, err := n.js.Stream(ctx, name); err != nil {
					return fmt.Errorf("stream %s: %w", name, err)
				}
				if _, err := n.js.Consumer(ctx, name, bus.ConsumerName(k)); err != nil {
					return fmt.Errorf("stream %s, consumer %s: %w", name, bus.ConsumerName(k), err)
				}
			}
			if k := n.keeper.Load(); k != nil {
				return k.Refusing()
			}
			return nil
		},
		ReadyRedis: func(ctx context.Context) error { return n.rdb.Ping(ctx).Err() },
		ReadyRegistry: func(context.Context) error {
			_, err := n.sys.Root.RequestFuture(n.router, &router.ListWorkers{}, readyRouterTimeout).Result()
			if err != nil {
				return fmt.Errorf("router: %w", err)
			}
			return nil
		},
	}
	return runReadyChecks(ctx, checks)
}

// runReadyChecks runs every check concurrently and collects the failures.
func runReadyChecks(ctx context.Context, checks map[string]func(context.Context) error) error {
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		failed = map[string]error{}
	)
	for name, check := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := check(ctx); err != nil {
				mu.Lock()
				failed[name] = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failed) > 0 {
		return &NotReadyError{Checks: failed}
	}
	return nil
}

// Saga describes a workflow's saga: its stack, the rollback's progress and
// each compensation's job and state (store.ErrNotFound when there is none).
func (n inspector) Saga(ctx context.Context, workflowID string) (*saga.Report, error) {
	r, err := saga.Describe(ctx, n.store, workflowID)
	if err != nil {
		return nil, err
	}
	if len(r.Steps) == 0 && !r.Triggered && (r.Progress == nil || (r.Progress.Status == "" && len(r.Progress.Steps) == 0)) {
		return nil, store.ErrNotFound
	}
	return r, nil
}
