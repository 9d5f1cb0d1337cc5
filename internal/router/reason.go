package router

import (
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/lifecycle"
)

// Permanent reports whether a routing failure will not fix itself without a
// change of config or of the job: no pool is mapped to the topic, the
// preferred pool is not one of them, or no mapped pool provides what the
// job requires. The job actor fails such a job (after a short grace window
// for rollout races) instead of backing off.
//
// Every other reason is transient (no_workers, pool_overloaded,
// stale_worker, tenant_limit, dispatch_failed: workers come back, load
// drains, limits free up), and so is any reason this function does not
// know: retrying is bounded by the scheduling attempts, while failing a job
// for a code added later would lose work.
func Permanent(r jobstate.Reason) bool { return lifecycle.Permanent(r) }
