package recovery

import (
	"context"
	"time"
)

// Housekeeping: the lock holder, every TrimEvery poll intervals (timed, as
// an idle poller ticks less often) and after that tick's wakes, trims expired entries from the terminal-state indexes and
// DLQ entries past their retention,
// moves DLQ entries their writer left in a job's outbox, and gives back
// tenant slots held by jobs that no longer run.
const (
	// TrimEvery: the poller trims expired entries from terminal-state
	// indexes every this many poll intervals (30 s by default), so
	// transitions do not pay for it.
	TrimEvery = 30
	// TenantSlotGrace: a tenant slot is only repaired once it is this old,
	// so a job admitted but not yet dispatched keeps it.
	TenantSlotGrace = time.Minute
	// DLQOutboxGrace: a DLQ entry is flushed from its job's outbox only
	// once it is this old, so the writer that wrote it moves it first.
	DLQOutboxGrace = 10 * time.Second
)

// HousekeepTimeout bounds the index trim, the DLQ outbox flush and the
// tenant slot repair.
const HousekeepTimeout = 30 * time.Second

func (p *DuePoller) housekeep(now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), HousekeepTimeout)
	defer cancel()
	if p.Store.Retention() > 0 { // kept forever: nothing to trim
		if _, err := p.Store.TrimTerminal(ctx, now.Add(-p.Store.Retention())); err != nil {
			p.Log.Warn("index trim failed", "err", err)
		}
	}
	if r := p.Store.DLQRetention(); r > 0 {
		if n, err := p.Store.TrimDLQ(ctx, now.Add(-r)); err != nil {
			p.Log.Warn("dlq trim failed", "err", err)
		} else if n > 0 {
			p.Log.Info("dlq entries past their retention dropped", "count", n, "retention", r)
		}
	}
	if n, err := p.Store.FlushDLQOutbox(ctx, DLQOutboxGrace, 500); err != nil {
		p.Log.Warn("dlq outbox flush failed", "err", err, "moved", n)
	} else if n > 0 {
		p.Log.Info("dlq entries moved from outboxes (their writer stopped before it moved them)", "count", n)
	}
	if n, err := p.Store.RepairTenantSlots(ctx, TenantSlotGrace, 500); err != nil {
		p.Log.Warn("tenant slot repair failed", "err", err, "given_back", n)
	} else if n > 0 {
		p.Log.Info("tenant slots given back", "count", n)
	}
	if p.Housekeep != nil {
		p.Housekeep(ctx)
	}
}
