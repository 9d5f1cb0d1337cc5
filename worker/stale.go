package worker

import (
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Stale dispatches. A node evicts a worker it has not heard for its
// liveness window and places the worker's unstarted jobs elsewhere; a
// worker that was only paused (SIGSTOP, a VM migration, a long GC) then
// finds those dispatches waiting in its socket, and running them would run
// each job twice. So a direct dispatch carries what the node had heard of
// this worker when it sent it (registry.EnvHeardBeat: the send time of the
// worker's latest heartbeat it had heard; registry.EnvEvictAfter: the
// window), and the worker drops one if, since that heartbeat, it went
// quiet for long enough that the node could have evicted it: a gap between
// its own heartbeats, or up to the moment it reads the dispatch, of
// staleFraction of the window or more. Every time is the worker's own
// clock, so clock skew between node and worker plays no part.
//
// A dropped dispatch is not answered: the node either placed the job
// elsewhere (it evicted this worker) or, if it kept it here, repeats the
// dispatch to a deduping worker until it shows it arrived — and the repeat
// carries a heartbeat heard after the silence, so it runs.

// staleFraction of the node's window is the silence after which a dispatch
// is dropped: the node counts the window from a heartbeat's arrival, which
// may come later than its sending; a quarter of the window absorbs that.
const staleFraction = 0.75

// beatKeep bounds the heartbeat send times kept: at a 500 ms interval,
// over half an hour. A dispatch naming a heartbeat older than the oldest
// kept, with the log full, is dropped (nothing shows the gap since).
const beatKeep = 4096

// beatLog is the worker's recent heartbeat send times, oldest first.
type beatLog struct {
	mu    sync.Mutex
	times []time.Time
	full  bool // entries were dropped to stay within beatKeep
}

// sent records a heartbeat sent at t (taken just before the packet's
// created_at, so never after it).
func (b *beatLog) sent(t time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.times) == beatKeep {
		copy(b.times, b.times[beatKeep/4:])
		b.times = b.times[:beatKeep-beatKeep/4]
		b.full = true
	}
	b.times = append(b.times, t)
}

// silentSince reports the longest stretch without a heartbeat from heard
// to now, and whether the log covers it.
func (b *beatLog) silentSince(heard, now time.Time) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.full && (len(b.times) == 0 || b.times[0].After(heard)) {
		return 0, false
	}
	prev, longest := heard, time.Duration(0)
	for _, t := range b.times {
		if !t.After(heard) {
			continue
		}
		longest = max(longest, t.Sub(prev))
		prev = t
	}
	return max(longest, now.Sub(prev)), true
}

// StaleDispatch reports whether req, read at now, reached this worker after
// a silence its node could have evicted it for (see above); a dispatch with
// no stamp, or one that does not parse, is not stale.
func (w *Worker) StaleDispatch(req *capv1.JobRequest, now time.Time) bool {
	heardNs, err1 := strconv.ParseInt(req.GetEnv()[registry.EnvHeardBeat], 10, 64)
	windowMs, err2 := strconv.ParseInt(req.GetEnv()[registry.EnvEvictAfter], 10, 64)
	if err1 != nil || err2 != nil || windowMs <= 0 {
		return false
	}
	silent, known := w.beats.silentSince(time.Unix(0, heardNs), now)
	if !known {
		return true
	}
	return float64(silent) >= staleFraction*float64(time.Duration(windowMs)*time.Millisecond)
}

// dropStale drops a stale dispatch of a job not held here (see above),
// reporting whether it did.
func (w *Worker) dropStale(subject string, req *capv1.JobRequest) bool {
	if !w.StaleDispatch(req, time.Now()) {
		return false
	}
	w.stale.Add(1)
	slog.Warn("worker: dispatch reached this worker after a silence its node could have evicted it for; dropped (the node placed the job elsewhere, or repeats it)",
		"worker_id", w.cfg.ID, "job_id", req.GetJobId(), "subject", subject)
	if w.cfg.OnStale != nil {
		w.cfg.OnStale(subject, req)
	}
	return true
}
