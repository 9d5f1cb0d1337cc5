package router

import (
	"sync"
	"time"

	"github.com/troupe-run/troupe/internal/registry"
)

// Eviction by evidence. The sweep evicts a worker whose heartbeats stopped
// for longer than its liveness window; three rules keep that decision to
// what the silence really shows:
//
//   - A job adopted or re-activated for a worker this router has already
//     evicted is that worker's loss at once: the router remembers evicted
//     workers' ids with their eviction time (evictedMemory) and answers an
//     Occupied for one with OnEvictJobs, carrying the eviction's time, so
//     the job's worker-lost grace runs from then, not from its adoption.
//   - Every worker silent at once is the bus's or this node's problem, not
//     every worker's (the hush): a stale worker is evicted only once some
//     other worker spoke after it should have; the first heartbeat after a
//     hush gives every worker a whole window to speak (registry.Reprieve).
//   - A worker not heard since the bus stalled (this node's link went down
//     or came back, or the hush) is kept for StallReconnect after the
//     stall, however short its window: every NATS client reconnects on its
//     own schedule (its reconnect wait), and a worker cut off by the stall
//     may have received a dispatch just before it and run it meanwhile, its
//     answer queued in its client until it reconnects. Evicting it would
//     place that job on another worker too (the job is DISPATCHED, its
//     start unheard). While kept it is stale: nothing new is placed on it.
//   - A dispatch carries what this router had heard of its worker when it
//     was sent (Beats): `troupe worker` drops one that arrives after a
//     silence this router could have evicted it for (worker.StaleDispatch).

// EvictedMemory bounds how long, and EvictedMemoryMax how many, evicted
// workers' ids the router remembers. An adoption comes within a few lock
// TTLs of the owner's death (minutes); after an hour the worker-lost grace
// of any job adopted for it would be long spent anyway.
const (
	EvictedMemory    = time.Hour
	EvictedMemoryMax = 10_000
)

// HushMax bounds the hush: if every worker stays silent this long while
// this node's own connection is up, they are taken to be gone (a host that
// ran them all died) and the sweep evicts them. A NATS server that stalls
// for longer also drops this node's connection (the client's pings go
// unanswered: internal/connect.NATSPingInterval), which holds evictions by
// the link rule instead.
const HushMax = 5 * time.Minute

// StallReconnect is how long after a stall of the bus (the last sweep
// that saw it) a worker not heard since is kept rather than evicted by its
// window (see above): several reconnect waits of a NATS client (nats.go's
// default 2 s), so a worker the stall cut off is heard again first. A
// worker that died with the stall is evicted this much later, and its
// unstarted jobs placed elsewhere then.
const StallReconnect = 10 * time.Second

// hushMinWorkers: a single worker's silence cannot be told from the
// bus's; it is evicted by its window alone (the link rule still holds).
const hushMinWorkers = 2

// evictedMemory remembers evicted workers' eviction times. order holds
// every eviction in time order; an entry whose time no longer matches the
// map (the worker came back, or was evicted again later) is stale and
// skipped.
type evictedMemory struct {
	at    map[string]time.Time
	order []eviction
}

type eviction struct {
	id string
	at time.Time
}

func (e *evictedMemory) add(id string, at time.Time) {
	if e.at == nil {
		e.at = map[string]time.Time{}
	}
	e.at[id] = at
	e.order = append(e.order, eviction{id, at})
	for len(e.at) > EvictedMemoryMax || len(e.order) > 2*EvictedMemoryMax {
		e.pop()
	}
}

// when returns id's eviction time, if remembered.
func (e *evictedMemory) when(id string) (time.Time, bool) {
	at, ok := e.at[id]
	return at, ok
}

// forget drops id: it heartbeats again.
func (e *evictedMemory) forget(id string) { delete(e.at, id) }

// expire drops the evictions before cutoff.
func (e *evictedMemory) expire(cutoff time.Time) {
	for len(e.order) > 0 && e.order[0].at.Before(cutoff) {
		e.pop()
	}
}

// pop drops the oldest entry of order, and its worker if it is current.
func (e *evictedMemory) pop() {
	old := e.order[0]
	e.order = e.order[1:]
	if at, ok := e.at[old.id]; ok && at.Equal(old.at) {
		delete(e.at, old.id)
	}
}

// Beats is what a node has heard of each worker, for its dispatches to
// carry (DispatchStamp): the send time of the worker's last heartbeat (its
// own clock) and the liveness window the router applies to it. The router
// writes it; job actors read it when they publish a dispatch. Safe for
// concurrent use.
type Beats struct{ m sync.Map }

type beat struct {
	sent   time.Time
	window time.Duration
}

// NewBeats returns an empty table.
func NewBeats() *Beats { return &Beats{} }

// Stamp returns what was last heard of workerID: the send time of its
// latest heartbeat (its clock) and its liveness window; ok is false for a
// worker not heard, or whose heartbeats carry no send time.
func (b *Beats) Stamp(workerID string) (sent time.Time, window time.Duration, ok bool) {
	if b == nil {
		return time.Time{}, 0, false
	}
	v, ok := b.m.Load(workerID)
	if !ok {
		return time.Time{}, 0, false
	}
	e := v.(beat)
	return e.sent, e.window, true
}

func (b *Beats) heard(workerID string, sent time.Time, window time.Duration) {
	if b == nil || sent.IsZero() {
		return
	}
	if v, ok := b.m.Load(workerID); ok && v.(beat).sent.After(sent) {
		return // an older beat arriving late tells nothing newer
	}
	b.m.Store(workerID, beat{sent: sent, window: window})
}

func (b *Beats) evicted(workerID string) {
	if b != nil {
		b.m.Delete(workerID)
	}
}

// occupiedLost handles an Occupied for a worker the registry no longer
// has: if the router evicted it, the job is lost with it, as of the
// eviction. It reports whether it did so.
func (r *Router) occupiedLost(m *Occupied) bool {
	if m.Heard || r.cfg.OnEvictJobs == nil {
		return false
	}
	at, ok := r.gone.when(m.WorkerID)
	if !ok {
		return false
	}
	r.log.Info("job held by a worker already evicted; lost as of the eviction",
		"job_id", m.JobID, "worker_id", m.WorkerID, "evicted_at", at)
	r.cfg.OnEvictJobs(m.WorkerID, []string{m.JobID}, at)
	return true
}

// hold reports whether the sweep must keep a stale worker for now: no
// heartbeat from anyone, nor any other message (Config.Heard), has reached
// this node since the worker should have spoken (its last beat plus one
// interval), so its silence may be the bus's or this node's, shared by
// every worker. A lone worker's silence has nothing
// to be compared with; it is evicted by its window (the link rule still
// holds). Past HushMax of such silence the workers are taken to be gone.
func (r *Router) hold(w *registry.Worker, now time.Time) bool {
	if r.reg.Len() < hushMinWorkers {
		return false
	}
	// When it should have spoken: an interval after its last beat, or less
	// where the window is cut shorter than its intervals (Config.TTL).
	every := r.reg.Window(w) / registry.MissedIntervals
	if w.Interval > 0 {
		every = min(every, w.Interval)
	}
	cut := w.LastSeen.Add(every)
	if r.lastHeard.After(cut) || r.busAt.After(cut) {
		return false // another worker, or the bus, spoke when this one should have
	}
	if r.hushSince.IsZero() {
		r.hushSince = now
		r.log.Warn("every worker went silent at once: taken as a stall of the bus or of this node; no eviction until heartbeats flow again",
			"workers", r.reg.Len(), "silent_for", now.Sub(r.lastHeard))
	}
	if now.Sub(r.hushSince) < HushMax {
		return true
	}
	r.log.Warn("every worker silent for longer than the hush allows while this node's link is up; evicting",
		"worker_id", w.ID, "silent_for", now.Sub(r.lastHeard))
	return false
}

// heardAgain takes in a heartbeat's arrival: the first one after a hush
// gives every worker's silence a fresh start, so each has a whole window
// to speak before it can be evicted (the heartbeats that queued during the
// stall arrive in a burst, in no useful order).
func (r *Router) heardAgain(now time.Time) {
	if now.After(r.lastHeard) {
		r.lastHeard = now
	}
	if r.hushSince.IsZero() {
		return
	}
	n := r.reg.Reprieve(now)
	r.log.Warn("heartbeats flow again after every worker went silent; worker silence counts from now",
		"hushed_for", now.Sub(r.hushSince), "workers", n)
	r.hushSince = time.Time{}
}

// noteTraffic records, at a sweep, whether this node's connection received
// messages since the last one (Config.Heard).
func (r *Router) noteTraffic(now time.Time) {
	if r.cfg.Heard == nil {
		return
	}
	if n := r.cfg.Heard(); n != r.heardMsgs {
		r.heardMsgs = n
		r.busAt = r.prevSweep
	}
	r.prevSweep = now
}

// stalled records that a sweep at now saw the bus stalled (see
// reconnecting).
func (r *Router) stalled(now time.Time) {
	if !now.After(r.stallAt) {
		return
	}
	r.stallAt = now
	r.stallKept = nil
}

// reconnecting reports whether the sweep must keep a stale worker because
// it has not been heard since the bus stalled, within StallReconnect of
// the stall: it may be reconnecting still, holding a job it received just
// before the stall (see above).
func (r *Router) reconnecting(w *registry.Worker, now time.Time) bool {
	if !r.hushSince.IsZero() && now.Sub(r.hushSince) >= HushMax {
		return false // nobody spoke again within HushMax: taken to be gone
	}
	if r.stallAt.IsZero() || w.LastSeen.After(r.stallAt) || !now.Before(r.stallAt.Add(StallReconnect)) {
		return false
	}
	if !r.stallKept[w.ID] {
		if r.stallKept == nil {
			r.stallKept = map[string]bool{}
		}
		r.stallKept[w.ID] = true
		r.log.Info("worker not heard since the bus stalled; kept while it may be reconnecting",
			"worker_id", w.ID, "last_seen", w.LastSeen, "stalled_at", r.stallAt, "keep_for", StallReconnect)
	}
	return true
}
