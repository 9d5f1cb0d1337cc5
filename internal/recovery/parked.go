package recovery

import (
	"context"
	"log/slog"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// Parked polls. A parked job (actors.JobActor.park) has no actor and so no
// timer: it waits in its node's parked set, scored by its deadline. Its own
// node wakes it when the deadline comes (on every tick, lock or not: no
// other node may, as its lock is that node's), and a node that restarts
// under the same id reads back the jobs it had parked in DISPATCHED, so
// their worker's progress or eviction still wakes them. The parked jobs of a
// dead node are adopted by the lock holder (deadnodes.go).

// wakeOwnParked wakes this node's own parked jobs whose deadline has come
// (up to PerShard per shard, each pushed back DueRetryAfter) and returns how
// many it woke.
func (p *DuePoller) wakeOwnParked(ctx context.Context, now time.Time) int {
	// No actor, no timer, and no other node may wake them (their lock is
	// ours).
	own, err := p.Store.ParkedDue(ctx, p.NodeID, now, now.Add(DueRetryAfter), p.PerShard)
	if err != nil {
		p.Log.Warn("parked poll failed", "err", err)
	}
	for _, id := range own {
		p.Intake.Wake(id)
	}
	return len(own)
}

// RememberParked reads the jobs an earlier process with this node id
// parked in DISPATCHED and hands them to in.RememberParked, so their
// worker's progress or eviction wakes them (the shards' memory of them died
// with that process). Until it is done, such an event is missed: the job
// still ends through its result or its deadline. It gives up after five
// minutes or when ctx ends; the node runs it once, at start.
func RememberParked(ctx context.Context, st *store.Store, nodeID string, in Intake, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	count := 0
	err := st.ParkedDispatched(ctx, nodeID, func(ids []string) {
		count += len(ids)
		in.RememberParked(ids)
	})
	if err != nil && ctx.Err() == nil {
		log.Warn("reading this node's parked jobs failed; their progress and eviction are missed until their results or deadlines", "err", err)
	} else if count > 0 {
		log.Info("parked jobs of an earlier run of this node remembered", "count", count)
	}
	// Jobs it parked waiting for rate limit tokens: their places in the
	// limiter's queue died with that process, so they are woken to ask
	// again.
	woken := 0
	err = st.ParkedIn(ctx, nodeID, func(ids []string) {
		woken += len(ids)
		for _, id := range ids {
			in.Wake(id)
		}
	}, jobstate.StateScheduled)
	if err != nil && ctx.Err() == nil {
		log.Warn("reading this node's parked rate limit waits failed; they wait for their deadlines", "err", err)
	} else if woken > 0 {
		log.Info("parked rate limit waits of an earlier run of this node woken", "count", woken)
	}
}
