package router

import (
	"maps"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/safety"
)

// The router's side of the wait queue (see waitq.go for the order).

const (
	// drainBudget bounds the waiters one wake looks at: a freed slot that
	// no waiter near the head can use (their placement labels need other
	// workers) costs at most this much, not a walk of the queue.
	drainBudget = 64
	// handoffTTL frees a placement whose job never answered (its actor
	// died between the Placed and the Took); a live job answers at once.
	handoffTTL = 30 * time.Second
)

// pick answers a PickRequest, queueing the job when it may wait.
func (r *Router) pick(c actor.Context, m *PickRequest) {
	if m.JobID != "" {
		if h, ok := r.handed[m.JobID]; ok {
			if m.Wait && h.ticket == m.Ticket {
				// The same wait asking again (its recheck) while a
				// placement is on its way to it: that placement will reach
				// it. Freeing it here would let another job take the slot
				// the job is about to dispatch on (an over-filled worker).
				c.Respond(&PickReply{Epoch: m.Epoch, Reason: jobstate.ReasonPoolOverloaded, Queued: true})
				return
			}
			// A job asking again under another ticket is not waiting for
			// an older placement: one still in flight to it is freed (its
			// actor restarted, say).
			delete(r.handed, m.JobID)
			r.vacate(c, h.w, m.JobID)
		}
		// Nor dispatching on an earlier pick it never started on or gave
		// back (it dropped the reply as stale, or restarted before acting
		// on it).
		r.dropEarlierPick(c, m.JobID)
	}
	p := r.strategy.PickFor(m.JobID, m.Req, r.now())
	reply := &PickReply{Epoch: m.Epoch, Subject: p.Subject, Reason: p.Reason, Detail: p.Detail}
	if p.Worker != nil {
		reply.WorkerID, reply.Pool = p.Worker.ID, p.Worker.Pool
		reply.Resend = p.Direct && p.Worker.Dedupe
		reply.StartsOnDelivery = !p.Worker.Reports
		if w := r.waiting[m.JobID]; w != nil {
			r.unlink(w)
			r.tidy(w.pools)
		}
		r.changed(c, p.Worker)
		r.track(m.JobID, p.Worker)
		c.Respond(reply)
		return
	}
	if m.Wait && m.JobID != "" && Waitable(p.Reason) && c.Sender() != nil {
		r.enqueue(m, c.Sender()).reason = p.Reason
		r.kick(c)
		reply.Queued = true
	} else if w := r.waiting[m.JobID]; w != nil {
		r.unlink(w) // it can no longer wait (its topic was unmapped, say)
		r.tidy(w.pools)
	}
	c.Respond(reply)
}

// enqueue adds the job to its candidate pools' queues, or, when it waits
// already, keeps its place and takes the new ticket and sender.
func (r *Router) enqueue(m *PickRequest, pid *actor.PID) *waiter {
	if w := r.waiting[m.JobID]; w != nil {
		w.pid, w.ticket, w.req = pid, m.Ticket, m.Req
		return w
	}
	r.seq++
	w := &waiter{jobID: m.JobID, pid: pid, req: m.Req, ticket: m.Ticket, tenant: safety.TenantOf(m.Req),
		rank: priorityRank(m.Req.GetPriority()), seq: r.seq, since: r.now()}
	w.pools = r.strategy.appendCandidates(w.pool1[:0]) // no slice of its own for one pool
	if !m.Submitted.IsZero() {
		w.submit = m.Submitted.UnixMilli()
	}
	for _, p := range w.pools {
		q := r.queues[p]
		if q == nil {
			q = &waitQueue{}
			r.queues[p] = q
		}
		q.push(w)
		q.live++
	}
	r.waiting[w.jobID] = w
	r.queueGauge()
	return w
}

// unlink takes w out of the waiting set; its links in the pools' queues go
// dead (tidy drops queues left empty).
func (r *Router) unlink(w *waiter) {
	if w.gone {
		return
	}
	w.gone = true
	delete(r.waiting, w.jobID)
	for _, p := range w.pools {
		if q := r.queues[p]; q != nil {
			q.live--
			q.compact()
		}
	}
	r.queueGauge()
}

// tidy forgets the queues of pools that hold nothing any more.
func (r *Router) tidy(pools []string) {
	for _, p := range pools {
		if q := r.queues[p]; q != nil && q.links == 0 {
			delete(r.queues, p)
		}
	}
}

// drainAll wakes every pool's queue (the config or the registry changed).
func (r *Router) drainAll(c actor.Context) {
	for p := range r.queues {
		r.drain(c, p)
	}
}

// drain places the head of pool's queue while the pool has room.
func (r *Router) drain(c actor.Context, pool string) {
	q := r.queues[pool]
	if q == nil || q.live == 0 {
		if r.reg.Top(pool) != nil {
			r.offerRoom(c, pool)
		}
		return
	}
	now := r.now()
	var skipped []*waiter
	for tries := 0; tries < drainBudget && q.live > 0 && r.reg.Top(pool) != nil; tries++ {
		w := q.pop()
		if w == nil {
			break
		}
		q.live--
		p := r.strategy.PickFor(w.jobID, w.req, now)
		if p.Worker == nil && Waitable(p.Reason) {
			// The room is where this job cannot go (labels, preferred
			// pool); it keeps its place.
			skipped = append(skipped, w)
			continue
		}
		q.live++ // unlink counts it out of every queue it is in
		r.unlink(w)
		// The Placed and its reply in one allocation.
		pl := &placedReply{reply: PickReply{Subject: p.Subject, Reason: p.Reason, Detail: p.Detail}}
		reply := &pl.reply
		if p.Worker != nil {
			reply.WorkerID, reply.Pool = p.Worker.ID, p.Worker.Pool
			reply.Resend = p.Direct && p.Worker.Dedupe
			reply.StartsOnDelivery = !p.Worker.Reports
			r.handed[w.jobID] = handoff{w: p.Worker, ticket: w.ticket, at: now}
			r.changed(c, p.Worker)
		}
		pl.Placed = Placed{JobID: w.jobID, Ticket: w.ticket, Reply: reply}
		c.Send(w.pid, &pl.Placed)
	}
	for _, w := range skipped {
		q.push(w)
		q.live++
	}
	r.tidy([]string{pool})
	r.kick(c)
	if r.reg.Top(pool) != nil {
		r.offerRoom(c, pool)
	}
}

// placedReply is a Placed and the reply it carries, allocated together
// (drain sends one a placed job: two allocations otherwise).
type placedReply struct {
	Placed
	reply PickReply
}

// vacate frees job's slot on w and gives it to the pool's queue — or, on
// a worker another replica owns, to the next job here that fits it, if
// that replica has none waiting (see refill).
func (r *Router) vacate(c actor.Context, w *registry.Worker, job string) {
	if !r.reg.Vacate(w, job) {
		return
	}
	r.changed(c, w)
	if r.reg.Away(w) {
		r.refill(c, w)
		return
	}
	if r.reg.HasRoom(w) {
		r.drain(c, w.Pool)
	}
}

// joined sets a worker seen for the first time up with what the other
// replicas have said about it, and with its steward.
func (r *Router) joined(c actor.Context, w *registry.Worker) {
	var n int32
	for _, p := range r.peers {
		n += p.counts[w.ID]
	}
	r.reg.SetOthers(w, n)
	r.placeShare(w)
}

// position is how many jobs wait before job in its first pool's queue, or
// -1 when it does not wait here.
func (r *Router) position(job string) int {
	w := r.waiting[job]
	if w == nil || len(w.pools) == 0 {
		return -1
	}
	best := -1
	for _, p := range w.pools {
		if q := r.queues[p]; q != nil {
			if n := q.position(w); best < 0 || n < best {
				best = n
			}
		}
	}
	return best
}

// waitingView describes job when it waits here, else nil.
func (r *Router) waitingView(job string) *Waiting {
	w := r.waiting[job]
	if w == nil {
		return nil
	}
	v := r.view(w, r.position(job))
	v.Pools = append([]string(nil), w.pools...)
	return &v
}

// view describes w, standing pos in its queue (-1: not computed).
func (r *Router) view(w *waiter, pos int) Waiting {
	return Waiting{JobID: w.jobID, Topic: w.req.GetTopic(), Tenant: w.tenant, Reason: w.reason,
		Position: pos, Since: w.since, Node: r.cfg.NodeID, Labels: maps.Clone(w.req.GetLabels())}
}

// listWaiting lists the waiting jobs of tenant ("": all), newest first,
// at most limit.
func (r *Router) listWaiting(tenant string, limit int) []Waiting {
	out := make([]Waiting, 0, min(limit, len(r.waiting)))
	for _, w := range r.waiting {
		if tenant != "" && w.tenant != tenant {
			continue
		}
		out = append(out, r.view(w, -1))
	}
	slices.SortFunc(out, func(a, b Waiting) int { return b.Since.Compare(a.Since) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out
}

// peerIDs lists the replicas this router hears.
func (r *Router) peerIDs() []string {
	out := make([]string, 0, len(r.peers))
	for id := range r.peers {
		out = append(out, id)
	}
	return out
}

// expireHandoffs frees placements whose job never answered.
func (r *Router) expireHandoffs(c actor.Context) {
	now := r.now()
	for id, h := range r.handed {
		if now.Sub(h.at) >= handoffTTL {
			delete(r.handed, id)
			r.log.Warn("placement never taken by its job; slot freed", "job_id", id, "worker_id", h.w.ID)
			r.vacate(c, h.w, id)
		}
	}
}

func (r *Router) queueGauge() {
	if r.metrics != nil {
		r.metrics.waiting.Set(float64(len(r.waiting)))
	}
}
