package recovery

import (
	"context"
	"time"

	"github.com/troupe-run/troupe/internal/store"
)

// Dead-node adoption. A parked job keeps its lock with no TTL
// (<node>|<fence>|p), held while its node's alive keys and its score in the
// nodes set are renewed (store.LockRenewer), and it has no lease: when its
// node dies no lease lapses for it (orphans.go), and only that node's parked
// sets know it. The lock holder finds dead nodes (a node lease older than a
// lock TTL, or given up at a graceful stop), marks each as being adopted
// (store.StartAdoption), wakes its parked jobs at a bounded rate — the woken
// job's activation takes its lock — and forgets the node once its parked
// sets are empty.

// DeadNodesPerTick bounds the dead nodes whose parked jobs one tick adopts
// (their jobs share the PerShard budget).
const DeadNodesPerTick = 8

// Adopted returns how many parked jobs of dead nodes this poller has woken
// for adoption (each once per offer; an offer that did not take is repeated
// DueRetryAfter later).
func (p *DuePoller) Adopted() int64 { return p.adopted.Load() }

// adoptDeadNodes returns parked jobs of dead nodes to wake (and so adopt):
// at most PerShard per shard over all dead nodes this tick.
func (p *DuePoller) adoptDeadNodes(ctx context.Context, now time.Time) []string {
	before := now.Add(-p.Store.LockTTL())
	dead, err := p.Store.DeadNodes(ctx, before, DeadNodesPerTick)
	if err != nil {
		p.Log.Warn("node lease poll failed", "err", err)
		return nil
	}
	var out []string
	budget := p.PerShard
	for _, d := range dead {
		if d.Node == p.NodeID || budget <= 0 {
			continue // our own lease lapsed: the renewer sets it again
		}
		if !d.Adopting {
			ok, err := p.Store.StartAdoption(ctx, d.Node, before)
			if err != nil {
				p.Log.Warn("adoption not started", "dead_node", d.Node, "err", err)
				continue
			}
			if !ok {
				continue // it renewed its lease meanwhile
			}
			p.Log.Warn("node lease expired; adopting its parked jobs", "dead_node", d.Node,
				"last_renewal", d.Renewed)
		}
		ids, err := p.Store.ParkedDue(ctx, d.Node, now, now.Add(DueRetryAfter), budget)
		if err != nil {
			p.Log.Warn("parked poll of a dead node failed", "dead_node", d.Node, "err", err)
			continue
		}
		if len(ids) == 0 {
			if n, err := p.Store.ParkedCount(ctx, d.Node); err == nil && n == 0 {
				if err := p.Store.ForgetNode(ctx, d.Node, before); err == nil {
					p.Log.Info("dead node's parked jobs all adopted", "dead_node", d.Node)
				}
			}
			continue
		}
		p.adopted.Add(int64(len(ids)))
		out = append(out, ids...)
		// Shards drain unevenly; the budget is per shard, so what one node
		// used of it is roughly its share.
		budget -= (len(ids) + store.Shards - 1) / store.Shards
	}
	return out
}
