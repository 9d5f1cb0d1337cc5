package registry

import "time"

// Heartbeat cadence against the configured TTL.
//
// A worker's liveness window is MissedIntervals+½ of its interval, cut to
// the configured TTL. Where the TTL is what cuts it, the worker pays for
// every late or lost heartbeat. With TTL ≥ MissedIntervals intervals, one
// lost heartbeat (a silence of two intervals) stays under both the
// eviction (TTL) and the point where `troupe worker` drops a direct
// dispatch as stale (¾ TTL ≥ 2¼ intervals, a quarter interval to spare
// for the dispatch's delivery). Below it, one lost heartbeat drops direct
// dispatches from 2⅔ intervals and evicts the worker from 2; under 1⅓
// intervals the last part of every interval drops them (a quarter of them
// at TTL = one interval) and any late beat evicts; under one interval the
// worker is evicted between any two beats and joins again at the next.
// So TooSlow says when the TTL is under MissedIntervals of a worker's
// steady interval, and the router warns about it and counts it.
//
// The steady interval is the second shortest of the last gapWindow gaps
// (or the announced interval): a lost heartbeat or a pause lengthens one
// gap, not three of four, so a healthy worker is not called too slow; a
// beat its busy process sent late is followed by one on time, a short gap
// that the shortest alone would take for the interval (a worker beating
// every 400 ms under a 1 s TTL went unwarned on a loaded machine). A worker evicted
// between beats would never stay long enough to show four gaps, so the
// registry keeps an evicted worker's cadence (its last beat and gaps) for
// trailKeep and takes it up again when the worker heartbeats: the gap
// across the eviction is one more gap.

// SDKHeartbeat is the stock CAP SDKs' heartbeat interval (the Go SDK's
// capsdk.DefaultHeartbeatInterval; `troupe worker`'s default too). A TTL
// under MissedIntervals of it makes such workers TooSlow.
const SDKHeartbeat = 5 * time.Second

// trailKeep is how long after its last heartbeat an evicted worker's
// cadence is kept. A worker heard again later than this was away rather
// than evicted between beats: the gap across its absence says nothing
// about its interval.
const trailKeep = 10 * time.Minute

// trailPruneEach spaces the scans for expired trails: one runs only when
// the trails are at their bound, so a mass eviction cannot scan them once
// per evicted worker.
const trailPruneEach = time.Minute

// cadence is what the registry learns of a worker's heartbeats' timing.
type cadence struct {
	lastBeat  time.Time // last real heartbeat (sent, or seen); zero after hydration
	sentClock bool      // lastBeat is the sender's time
	gaps      [gapWindow]time.Duration
	nGaps     int
	gapPos    int
	// steady is the announced interval, or the second shortest of a full window
	// of gaps; 0 while unknown.
	steady time.Duration
}

// BeatEvery is the worker's steady heartbeat interval (see above): the
// interval it announced, or the second shortest of its last four gaps; 0 while
// unknown.
func (w *Worker) BeatEvery() time.Duration { return w.steady }

// TooSlow reports whether w's steady interval is too long for the
// configured TTL: the TTL is under MissedIntervals intervals (see above).
func (r *Registry) TooSlow(w *Worker) bool {
	return w.steady > 0 && r.ttl < MissedIntervals*w.steady
}

// trails are evicted workers' cadences by id, at most a registry's
// MaxWorkers of them. Confined to the registry's goroutine.
type trails struct {
	m      map[string]trail
	pruned time.Time
}

type trail struct {
	cadence
	seen time.Time // the worker's last heartbeat, this node's clock
}

// keep remembers the cadence of w, evicted at now.
func (t *trails) keep(w *Worker, now time.Time, bound int) {
	if w.lastBeat.IsZero() || now.Sub(w.LastSeen) > trailKeep {
		return
	}
	if t.m == nil {
		t.m = map[string]trail{}
	}
	if len(t.m) >= bound && now.Sub(t.pruned) >= trailPruneEach {
		t.pruned = now
		for id, tr := range t.m {
			if now.Sub(tr.seen) > trailKeep {
				delete(t.m, id)
			}
		}
	}
	if len(t.m) < bound {
		t.m[w.ID] = trail{cadence: w.cadence, seen: w.LastSeen}
	}
}

// resume gives w, heard again at now, the cadence it had when evicted.
func (t *trails) resume(w *Worker, now time.Time) {
	tr, ok := t.m[w.ID]
	if !ok {
		return
	}
	delete(t.m, w.ID)
	if now.Sub(tr.seen) <= trailKeep {
		w.cadence = tr.cadence
	}
}

// TooSlowPerPool counts the live workers that are TooSlow, by pool; a pool
// with none is absent.
func (r *Registry) TooSlowPerPool(now time.Time) map[string]int {
	var out map[string]int
	for name, p := range r.pools {
		for _, w := range p.members {
			if r.Live(w, now) && r.TooSlow(w) {
				if out == nil {
					out = map[string]int{}
				}
				out[name]++
			}
		}
	}
	return out
}
