package router

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/registry"
)

// Picks not yet confirmed. A pick (or a queued placement the job took)
// counts a slot on the worker under the job's id until the job says it
// started there or gave the slot back (Released), or its answer is seen.
// Nothing else frees it: a job whose actor stopped or restarted before it
// acted on the reply, or that dropped the reply as stale, would leave the
// slot counted for the worker's lifetime — and the worker's eviction would
// report the job lost (OnEvictJobs), though it never went there.
//
// So the router remembers the slots it counted and that have not started,
// and frees those still unconfirmed after Config.PickTTL: by then a job
// that was dispatched has either started (Released without Done) or given
// its slot back, since its dispatch timeout has passed. A job that asks
// for a worker again frees its earlier unconfirmed pick at once.

// PickTTLDefault is Config.PickTTL's default: twice the default dispatch
// timeout (actors.DispatchTimeoutDefault, 300 s).
const PickTTLDefault = 10 * time.Minute

// pickRec is a slot counted for a job that has not started on it.
type pickRec struct {
	w  *registry.Worker
	at time.Time
}

// track remembers that job's slot on w is counted and not started.
func (r *Router) track(job string, w *registry.Worker) {
	if job == "" || r.cfg.PickTTL < 0 {
		return
	}
	r.picks[job] = pickRec{w: w, at: r.now()}
}

// confirmPick forgets job's unconfirmed slot on the worker workerID: the job
// started there, or gave the slot back.
func (r *Router) confirmPick(job, workerID string) {
	if p, ok := r.picks[job]; ok && p.w.ID == workerID {
		delete(r.picks, job)
	}
}

// dropEarlierPick frees job's unconfirmed slot: the job asks for a worker
// again, so it is not dispatching there.
func (r *Router) dropEarlierPick(c actor.Context, job string) {
	p, ok := r.picks[job]
	if !ok {
		return
	}
	delete(r.picks, job)
	if r.reg.Get(p.w.ID) == p.w && r.reg.Unstarted(p.w, job) {
		r.vacate(c, p.w, job)
	}
}

// expirePicks frees the slots unconfirmed for longer than PickTTL.
func (r *Router) expirePicks(c actor.Context) {
	if len(r.picks) == 0 {
		return
	}
	now := r.now()
	for job, p := range r.picks {
		if now.Sub(p.at) < r.cfg.PickTTL {
			continue
		}
		delete(r.picks, job)
		if r.reg.Get(p.w.ID) != p.w || !r.reg.Unstarted(p.w, job) {
			continue // evicted since, or the slot went another way
		}
		r.log.Warn("pick never dispatched or given back by its job; slot freed", "job_id", job,
			"worker_id", p.w.ID, "picked_at", p.at)
		r.vacate(c, p.w, job)
	}
}
