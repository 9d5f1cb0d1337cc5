package recovery

import (
	"context"
	"time"

	"github.com/troupe-run/troupe/internal/store"
)

// Orphan leases. A job's lock has a lease in its shard's leases set, moved
// forward with every renewal; a lease in the past means its owner died. The
// lock holder wakes such jobs at once, with the time the lease lapsed, so
// another node adopts them (its activation takes the expired lock with a new
// fence) rather than at their deadline or when their result happens to
// arrive. Parked jobs have no lease (deadnodes.go).

// orphanLeases reads up to PerShard jobs per shard whose owner stopped
// renewing their lease (pushing each back DueRetryAfter).
func (p *DuePoller) orphanLeases(ctx context.Context, now time.Time) []store.Orphan {
	orphans, err := p.Store.ExpiredLeases(ctx, now, now.Add(DueRetryAfter), p.PerShard)
	if err != nil {
		p.Log.Warn("lease poll failed", "err", err)
	}
	return orphans
}

// wakeOrphans wakes each orphan for adoption, with the time its lease
// lapsed (so the adoption latency can be measured), and returns ids with
// the orphans' ids appended.
func (p *DuePoller) wakeOrphans(orphans []store.Orphan, ids []string) []string {
	for _, o := range orphans {
		p.Intake.WakeOrphan(o.JobID, o.LapsedAt)
		ids = append(ids, o.JobID)
	}
	return ids
}
