package registry

import "time"

// Pool-wide reconciliation of the in-flight counts of workers that take
// their jobs on the pool subject.
//
// A job sent on a pool subject is counted on the worker the router picked,
// but NATS hands it to whichever member of the queue group it likes: the
// picked worker's active_jobs says nothing about it. Comparing the two per
// worker would free the slot of a job running on another member whose last
// heartbeat predates the job's arrival — nobody would count it, and the
// pool would take more jobs than it has slots. So these workers ("shared")
// are reconciled as one: this node's jobs on them are old once every
// member of the pool has sent two heartbeats since the job was placed
// (rounds: a round ends when every member has beaten during it), and the
// pool frees the difference only when its old jobs outnumber the sum of
// every member's last active_jobs. The test stays one-sided: the sum
// counts every job of every member, this node's or not, so it can only
// over-state what the pool holds of ours.
//
// Workers on their direct subject (LabelDispatch=direct) keep the
// per-worker test of reconcile: what is sent there runs there.

// stamps is how many placement stamps the young buckets keep: a job stamped
// s is old once the stamp counter reaches s+3 (pool rounds) or s+2 (a
// direct worker's beats), so four buckets never mix two stamps.
const stamps = 4

// poolCounts is a pool's reconciliation state.
type poolCounts struct {
	round   uint32 // rounds started (the current one included)
	pending int    // members not yet beaten during the current round
	// Sums over the members: every member's last active_jobs, how many
	// have not reported it (then nothing is freed), and the shared
	// members' old jobs of this node and those of them freed.
	active, old, gone int32
	unreported        int
	// startedAt is when the last job on a member started (Start): a beat
	// sent before it does not end its member's part in a round.
	startedAt time.Time
}

// stamp is the counter a job placed on w now is stamped with.
func (w *Worker) stamp() uint32 {
	if w.shared {
		return w.pool.round
	}
	return w.beats
}

// isOld reports whether a job stamped placed counts as old on w.
func (w *Worker) isOld(placed uint32) bool {
	if w.shared {
		return placed+3 <= w.pool.round
	}
	return placed+2 <= w.beats
}

// unsum takes w's part out of its pool's sums; sum puts it back.
func (p *poolIndex) unsum(w *Worker) {
	p.active -= w.ActiveJobs
	if !w.reported {
		p.unreported--
	}
	if w.shared {
		p.old -= w.oldOwn
		p.gone -= w.gone
	}
}

func (p *poolIndex) sum(w *Worker) {
	p.active += w.ActiveJobs
	if !w.reported {
		p.unreported++
	}
	if w.shared {
		w.gone = min(w.gone, w.oldOwn)
		p.old += w.oldOwn
		p.gone += w.gone
	}
}

// restamp makes every job of w young under the counter of its present
// mode (shared or not): after a change of mode or pool, how old a job is
// is not known, so it ages again from now (which can only delay a free).
func (w *Worker) restamp() {
	w.young = [stamps]int32{}
	w.oldOwn, w.gone = 0, 0
	s := w.stamp()
	for id, m := range w.jobs {
		if m&jobUnsent != 0 {
			continue // ages from its start
		}
		w.jobs[id] = m&jobStarted | s
		w.young[s%stamps]++
	}
}

// joinCounts adds a worker just attached to p: it counts as having beaten
// in the current round (it did, or was hydrated), and its jobs age from
// now.
func (r *Registry) joinCounts(w *Worker, p *poolIndex) {
	w.shared = !w.Direct
	w.restamp()
	w.roundSeen = p.round
	p.sum(w)
	if p.pending <= 0 { // a new pool
		r.nextRound(p)
	}
	r.rebalance(p, nil)
}

// leaveCounts takes a worker about to be detached out of p. Its jobs go
// back to per-worker counting, young.
func (r *Registry) leaveCounts(w *Worker, p *poolIndex) {
	p.unsum(w)
	if w.roundSeen != p.round {
		p.pending--
	}
	w.shared = false
	w.restamp()
}

// afterLeave ends the current round if the members that left were the last
// it waited for.
func (r *Registry) afterLeave(p *poolIndex) {
	if p.pending <= 0 && len(p.members) > 0 {
		r.nextRound(p)
	}
	r.rebalance(p, nil)
}

// beatCounts records a heartbeat of w in its pool's round.
func (r *Registry) beatCounts(w *Worker) {
	p := w.pool
	if w.roundSeen == p.round || w.beatAt.Before(p.startedAt) {
		return
	}
	w.roundSeen = p.round
	if p.pending--; p.pending <= 0 {
		r.nextRound(p)
	}
}

// nextRound starts a round: every member has beaten during the last one.
// Shared members' jobs placed three rounds ago become old.
func (r *Registry) nextRound(p *poolIndex) {
	p.round++
	p.pending = len(p.members)
	i := (p.round - 3) % stamps
	for _, w := range p.members {
		if w.shared && w.young[i] != 0 {
			w.oldOwn += w.young[i]
			p.old += w.young[i]
			w.young[i] = 0
		}
	}
}

// rebalance frees, across p's shared members, as many of this node's old
// jobs as the pool's reports say are not there (none while a member has
// not reported active_jobs), starting with prefer.
func (r *Registry) rebalance(p *poolIndex, prefer *Worker) {
	var want int32
	if p.unreported == 0 {
		want = max(0, p.old-p.active)
	}
	if want == p.gone {
		return
	}
	if prefer != nil && prefer.shared {
		r.shift(p, prefer, want)
	}
	for _, w := range p.members {
		if p.gone == want {
			return
		}
		if w.shared {
			r.shift(p, w, want)
		}
	}
}

// shift moves as much of p's difference to want as w can take: w frees at
// most its old jobs.
func (r *Registry) shift(p *poolIndex, w *Worker, want int32) {
	d := want - p.gone
	if d > 0 {
		d = min(d, w.oldOwn-w.gone)
	} else {
		d = max(d, -w.gone)
	}
	if d != 0 {
		w.gone += d
		p.gone += d
		r.reload(w)
	}
}

// vacateShared takes an old job of a shared worker (already out of its
// oldOwn) out of its pool's sums.
func (r *Registry) vacateShared(w *Worker) {
	p := w.pool
	p.old--
	if w.gone > w.oldOwn {
		w.gone--
		p.gone--
	}
	r.rebalance(p, w)
}
