package troupe

import (
	"context"
	"testing"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobdata"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/jobtrace"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/schedule"
	"github.com/troupe-run/troupe/internal/store"
)

// The node's inside view (inspector.go, package inspect) as methods of
// Node, for this package's tests: they check what the store, the router
// and the admin API see.

func (n *Node) Store() *store.Store                   { return inspector{n}.Store() }
func (n *Node) Subjects() bus.Subjects                { return inspector{n}.Subjects() }
func (n *Node) Mappings() *router.MappingStore        { return inspector{n}.Mappings() }
func (n *Node) PoolConfig() *router.PoolConfig        { return inspector{n}.PoolConfig() }
func (n *Node) JobData() *jobdata.Store               { return inspector{n}.JobData() }
func (n *Node) Workers() ([]router.WorkerInfo, error) { return inspector{n}.Workers() }
func (n *Node) Schedules() *schedule.Store            { return inspector{n}.Schedules() }

func (n *Node) ListJobs(ctx context.Context, q store.ListQuery) (store.JobPage, error) {
	return inspector{n}.ListJobs(ctx, q)
}

func (n *Node) CountStates(ctx context.Context) (map[jobstate.State]int64, error) {
	return inspector{n}.CountStates(ctx)
}

func (n *Node) JobLinks(ctx context.Context, jobID string) (store.JobLinks, error) {
	return inspector{n}.JobLinks(ctx, jobID)
}

func (n *Node) ListDLQ(ctx context.Context, limit int64) ([]store.DLQEntry, error) {
	return inspector{n}.ListDLQ(ctx, limit)
}

func (n *Node) DLQEntry(ctx context.Context, entryID string) (*store.DLQEntry, error) {
	return inspector{n}.DLQEntry(ctx, entryID)
}

func (n *Node) JobTrace(ctx context.Context, jobID string) ([]jobtrace.Entry, error) {
	return inspector{n}.JobTrace(ctx, jobID)
}

func (n *Node) Saga(ctx context.Context, workflowID string) (*saga.Report, error) {
	return inspector{n}.Saga(ctx, workflowID)
}

func (n *Node) ListSagas(ctx context.Context, limit int, cursor string) ([]saga.Listed, string, error) {
	return inspector{n}.ListSagas(ctx, limit, cursor)
}

func (n *Node) WaitingJob(ctx context.Context, jobID string) (*router.Waiting, error) {
	return inspector{n}.WaitingJob(ctx, jobID)
}

func (n *Node) WaitingJobs(ctx context.Context, tenant string, limit int) ([]router.Waiting, error) {
	return inspector{n}.WaitingJobs(ctx, tenant, limit)
}

// Record reads a job's record as the store holds it.
func (n *Node) Record(ctx context.Context, jobID string) (*store.JobRecord, error) {
	return n.store.GetJob(ctx, jobID)
}

// WaitRecord is Wait returning the store's record.
func (n *Node) WaitRecord(ctx context.Context, jobID string) (*store.JobRecord, error) {
	return n.waitRecord(ctx, jobID)
}

// List returns a page of jobs, newest first: of one state, or with
// q.State "" of every state.
func (c *Client) List(ctx context.Context, q store.ListQuery) (store.JobPage, error) {
	if q.State == "" {
		return c.store.ListRecent(ctx, q)
	}
	return c.store.ListJobs(ctx, q)
}

// TestPublicStatesAreTheJobStates checks that the public State and
// Decision values are the ones the store writes.
func TestPublicStatesAreTheJobStates(t *testing.T) {
	public := []State{StatePending, StateApprovalRequired, StateScheduled, StateDispatched, StateRunning,
		StateSucceeded, StateFailed, StateTimeout, StateCancelled, StateDenied, StateOutputQuarantined}
	if len(public) != len(jobstate.AllStates) {
		t.Fatalf("%d public states, %d job states", len(public), len(jobstate.AllStates))
	}
	for i, s := range jobstate.AllStates {
		if string(public[i]) != string(s) || public[i].Terminal() != s.Terminal() {
			t.Errorf("state %d: public %q, job state %q", i, public[i], s)
		}
	}
	if string(DecisionApproved) != string(store.DecisionApproved) || string(DecisionRejected) != string(store.DecisionRejected) {
		t.Errorf("decisions %q %q, store's %q %q", DecisionApproved, DecisionRejected, store.DecisionApproved, store.DecisionRejected)
	}
}

func (n *Node) LiveJobActors() (int, error) { return inspector{n}.LiveJobActors() }

func (n *Node) RetryDLQ(ctx context.Context, entryID string, force bool) (string, error) {
	return inspector{n}.RetryDLQ(ctx, entryID, force)
}

func (n *Node) DLQRetried(ctx context.Context, entryIDs []string) (map[string]string, error) {
	return inspector{n}.DLQRetried(ctx, entryIDs)
}
