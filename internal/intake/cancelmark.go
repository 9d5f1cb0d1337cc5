package intake

import (
	"context"
	"slices"
	"time"

	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/signing"
)

// markTenants is the tenants a cancel by p may be recorded for while its
// job has no record (see markHeld): any tenant for an unsigned cancel, a
// node's, an operator's and a legacy key's; a client key's own tenants;
// none for a worker key (a worker cancels no job it was not given).
func markTenants(p *signing.Principal) []string {
	switch {
	case p == nil, p.Legacy(), p.Role == signing.RoleNode, p.Role == signing.RoleOperator:
		return []string{store.AnyTenant}
	case p.Role == signing.RoleClient:
		if slices.Contains(p.Tenants, signing.Wildcard) {
			return []string{store.AnyTenant}
		}
		return p.Tenants
	}
	return nil
}

// markBudget bounds the cancel mark's write.
const markBudget = 2 * time.Second

// markHeld records c as a cancel mark when its job has no record and waits
// on no node: its submit, if it comes, is still held in the stream (back
// pressure, every node busy), and the job will be created CANCELLED when a
// node takes it. It reports whether it did (c is then acked); otherwise
// the cancel goes the usual way — to the job's record, or held, then
// dead-lettered unknown_job, for a canceller that may cancel for no tenant
// or when Redis cannot be asked.
func (in *Intake) markHeld(jobID string, c *jobactor.Cancel) bool {
	if in.Store == nil || in.Env.DataLost != nil && in.Env.DataLost() {
		// After a loss of Redis's data a job with no record may be one
		// Redis lost: its cancel is dead-lettered state_lost, the client
		// told, as any event for such a job (see jobactor.Env.DataLost).
		return false
	}
	tenants := markTenants(jobactor.PrincipalOf(c.By))
	if len(tenants) == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), markBudget)
	defer cancel()
	reason := c.C.GetReason()
	if err := in.Store.MarkCancel(ctx, jobID, tenants, c.C.GetRequestedBy(), reason); err != nil {
		return false
	}
	// No record: a delayed job not yet due is removed too (the mark
	// expires long before a far run_at).
	if in.CancelDelayed != nil && in.CancelDelayed(ctx, jobID, tenants) {
		in.Log.Info("delayed job cancelled before its time; it never runs", "job_id", jobID, "trace_id", c.TraceID,
			"by", c.C.GetRequestedBy())
		_ = c.Delivery.Ack()
		return true
	}
	in.Log.Info("cancel recorded for a job not yet admitted; it is created CANCELLED when a node takes it",
		"job_id", jobID, "trace_id", c.TraceID, "by", c.C.GetRequestedBy())
	_ = c.Delivery.Ack()
	return true
}
