package troupe

import (
	"context"

	"github.com/troupe-run/troupe/internal/keyslot"
	"github.com/troupe-run/troupe/internal/recovery"
	"github.com/troupe-run/troupe/internal/router"
)

// keySlotGrace: a concurrency key slot is repaired only once it is this
// old, so a job that took it and is not yet dispatched keeps it; at least
// twice lifecycle.KeySlotFresh, past which a dispatch is not published.
const keySlotGrace = recovery.TenantSlotGrace

// keyLimit is the core's view of pools.yaml's concurrency_keys: a key's own
// entry, else "*"'s (nil without any: keys are ignored).
func keyLimit(keys map[string]router.KeyLimit) func(string) (int, string) {
	if len(keys) == 0 {
		return nil
	}
	return func(key string) (int, string) {
		if keyslot.CheckKey(key) != nil {
			return 0, ""
		}
		kl, ok := keys[key]
		if !ok {
			kl = keys["*"]
		}
		return kl.Limit, kl.Strategy
	}
}

// repairKeySlots gives back the key slots of jobs no longer with a worker
// and drops the waits of ended jobs (a node died between a job's end and
// its release); run with the due poller's housekeeping.
func (n *Node) repairKeySlots(ctx context.Context) {
	if n.keySlots == nil {
		return
	}
	states := func(ctx context.Context, ids []string) ([]string, error) {
		m, err := n.store.States(ctx, ids)
		if err != nil {
			return nil, err
		}
		out := make([]string, len(ids))
		for i, id := range ids {
			out[i] = string(m[id])
		}
		return out, nil
	}
	var limit func(string) int
	if lim := n.keyLimitNow(); lim != nil {
		limit = func(key string) int { l, _ := lim(key); return l }
	}
	if freed, err := n.keySlots.Repair(ctx, keySlotGrace, 500, states, limit); err != nil {
		n.log.Warn("concurrency key slot repair failed", "err", err, "given_back", freed)
	} else if freed > 0 {
		n.log.Info("concurrency key slots given back", "count", freed)
	}
}

// ConcurrencyKeys lists each key's limit, strategy, holders, lingering
// slots and waiters (at most max keys), for the admin API (admin.KeyNode); on is false
// without concurrency_keys.
func (i inspector) ConcurrencyKeys(ctx context.Context, max int) (stats []keyslot.Stat, on bool, err error) {
	if i.keySlots == nil {
		return nil, false, nil
	}
	stats, err = i.keySlots.Stats(ctx, max)
	if lim := i.keyLimitNow(); lim != nil { // the limits in force (a reload changes them)
		for j := range stats {
			stats[j].Limit, stats[j].Strategy = lim(stats[j].Key)
		}
	}
	return stats, true, err
}
