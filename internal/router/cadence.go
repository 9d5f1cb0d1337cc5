package router

import (
	"time"

	"github.com/troupe-run/troupe/internal/registry"
)

// SlowBeatWarnEvery spaces the warnings about one worker that heartbeats
// too seldom for the node's worker TTL (registry.TooSlow): the first comes
// when four gaps show it, the next no sooner than this, so a fleet started
// with the wrong interval logs each worker once, not at every beat or
// every time the short TTL evicts it and it joins again. The gauge
// troupe_workers_heartbeat_too_slow says it all the while.
const SlowBeatWarnEvery = 10 * time.Minute

// SlowBeatWarnMax bounds those warnings per SlowBeatWarnEvery, node-wide:
// a fleet of thousands started with the wrong interval gets a hundred
// lines naming workers and one saying the rest are counted, not a line per
// worker.
const SlowBeatWarnMax = 100

// checkCadence warns about w, heard at now, if it is too slow for the TTL
// and was not warned about lately. It allocates only for a warning.
func (r *Router) checkCadence(w *registry.Worker, now time.Time) {
	if !r.reg.TooSlow(w) {
		return
	}
	if !r.slowWarned.due(w.ID, now) {
		return
	}
	if now.Sub(r.slowPeriod) >= SlowBeatWarnEvery {
		r.slowPeriod, r.slowLogged = now, 0
	}
	r.slowLogged++
	every, ttl := w.BeatEvery(), r.reg.TTL()
	if r.slowLogged > SlowBeatWarnMax {
		if r.slowLogged == SlowBeatWarnMax+1 {
			r.log.Warn("more workers heartbeat too seldom for this node's worker TTL; not named until the period ends: see troupe_workers_heartbeat_too_slow and `troupe workers`",
				"worker_ttl", ttl, "period", SlowBeatWarnEvery)
		}
		return
	}
	r.log.Warn("worker heartbeats too seldom for this node's worker TTL: one lost heartbeat gets it evicted or its direct dispatches dropped as stale; "+
		"make it beat at least every beat_at_most, or raise the node's worker TTL (troupe node --worker-ttl, Tuning.WorkerTTL) to ttl_at_least",
		"worker_id", w.ID, "pool", w.Pool, "heartbeat_interval", every, "worker_ttl", ttl,
		"beat_at_most", ttl/registry.MissedIntervals, "ttl_at_least", every*registry.MissedIntervals)
}

// forgetWarnings drops the warnings older than their period, at most once
// per period (recentWarnings.prune): workers come and go under new ids.
func (r *Router) forgetWarnings(now time.Time) {
	r.slowWarned.prune(now)
	r.warned.prune(now)
}
