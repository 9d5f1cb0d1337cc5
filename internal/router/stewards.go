package router

import (
	"hash/fnv"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/registry"
)

// Placement shares between replicas.
//
// Counting alone (gossip.go) cannot keep replicas that share a worker
// under its max_parallel: two of them may see the same free slot in the
// same few milliseconds and both fill it. So the slots of each worker with
// a max_parallel are split between the live replicas: each ranks itself
// by the rendezvous hash of (replica, worker), which every replica
// computes alike from the replicas it hears, and may count at most its
// share of the worker's slots — max_parallel / replicas, the remainder
// going one slot each to the highest ranks (registry.SetShare). Within its
// share a replica places jobs directly, so every replica admits and places
// its jobs at the same pace (one replica owning whole workers placed
// nearly all the jobs, and the submits followed its room). Slots a
// replica does not use move in two ways that never race:
//
//   - Offer: a replica with room in its share and no job of its own that
//     fits offers slots to a replica that reports waiting jobs for the
//     pool. It counts the offered slots as its own until the replica's
//     answer, which carries the replica's new count in the same report;
//     the replica places at most that many jobs on the worker.
//   - Refill: a slot freed by one of its own jobs on a worker where a
//     replica is past its share (it was offered slots) is its to reuse at
//     once, in the same step, for a job of its that fits — unless another
//     replica reports jobs waiting for that pool, in which case the slot
//     goes back (its count drops, and the others see the room).
//
// So every slot is at any moment counted by exactly one replica, and a
// replica's stale view of another can only over-count. What remains is a
// change of membership: while replicas disagree on who is alive, their
// shares may add up to more than max_parallel for the time a report takes
// (milliseconds), and a replica that dies leaves its jobs counted only by
// the workers' heartbeats until their adopters count them again.
//
// The replica of rank 0 is the worker's steward, shown in the registry
// snapshot (WorkerInfo.Steward); it holds nothing. A job's holder
// (internal/lifecycle, lock.go) is the node holding the job's lock.

const (
	// OfferTTL frees the slots of an offer that was never answered (the
	// replica died, or the report was lost).
	OfferTTL = 2 * time.Second
	// declineFor is how long a replica that could not use an offer for a
	// pool (its waiting jobs need other workers) gets no more offers for
	// it, unless its queue for the pool changes.
	declineFor = time.Second
)

// Offer gives To up to N slots on Worker.
type Offer struct {
	To     string
	ID     uint64
	Worker string
	N      int32
}

// OfferAck answers offer ID: Used of its slots were taken, and Count is
// the answering replica's count on Worker with them.
type OfferAck struct {
	To     string
	ID     uint64
	Worker string
	Used   int32
	Count  int32
}

// offer is an offer this node made and has not had answered.
type offer struct {
	to   string
	pool string
	w    *registry.Worker
	n    int32
	at   time.Time
}

func stewardScore(node, worker string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(worker))
	return h.Sum64()
}

// stewardOf is the replica of rank 0 for worker (the highest score among
// this node and the replicas it hears), shown in the registry snapshot.
func (r *Router) stewardOf(worker string) string {
	best, top := r.cfg.NodeID, stewardScore(r.cfg.NodeID, worker)
	for id := range r.peers {
		if s := stewardScore(id, worker); s > top || (s == top && id < best) {
			best, top = id, s
		}
	}
	return best
}

// rankOf is this node's rank for worker among itself and the replicas it
// hears (0: the steward, the highest score), and how many they are.
func (r *Router) rankOf(worker string) (rank, of int) {
	mine := stewardScore(r.cfg.NodeID, worker)
	for id := range r.peers {
		if s := stewardScore(id, worker); s > mine || (s == mine && id < r.cfg.NodeID) {
			rank++
		}
	}
	return rank, len(r.peers) + 1
}

// placeShare sets w's placement up for the replicas this node hears: each
// of them places jobs directly on its own share of w's slots (SetShare;
// the steward's rank takes a remainder slot first).
func (r *Router) placeShare(w *registry.Worker) {
	rank, of := r.rankOf(w.ID)
	r.reg.SetAway(w, false)
	r.reg.SetShare(w, rank, of)
}

// reassignShares recomputes every worker's shares after the replicas changed, and
// wakes the pools of workers on which this node now has room.
func (r *Router) reassignShares(c actor.Context) {
	for _, pool := range r.reg.Pools() {
		gained := false
		for _, w := range r.reg.Pool(pool) {
			was, share := r.reg.Away(w), r.reg.Share(w)
			r.placeShare(w)
			if now := r.reg.Share(w); (was && !r.reg.Away(w)) || (share >= 0 && (now < 0 || now > share)) {
				gained = true // a replica left: this node's share grew
			}
		}
		if gained {
			r.drain(c, pool)
		}
	}
}

// refill reuses a slot just freed on a worker on which this node is past
// its share (it was offered slots) for the next job here that fits it,
// unless a replica has jobs waiting for the pool: then the slot goes back.
func (r *Router) refill(c actor.Context, w *registry.Worker) {
	for _, p := range r.peers {
		if p.waiting[w.Pool] > 0 {
			return
		}
	}
	r.placeOn(c, w, 1)
}

// placeOn places up to n of the pool's waiting jobs on w (slots this node
// stewards: a refill or an offer) and returns how many it placed.
func (r *Router) placeOn(c actor.Context, w *registry.Worker, n int32) int32 {
	q := r.queues[w.Pool]
	if q == nil || q.live == 0 {
		return 0
	}
	now := r.now()
	var placed int32
	var skipped []*waiter
	for tries := 0; tries < drainBudget && placed < n && q.live > 0; tries++ {
		wt := q.pop()
		if wt == nil {
			break
		}
		q.live--
		p, ok := r.strategy.PickOn(wt.jobID, w, wt.req, now)
		if !ok {
			skipped = append(skipped, wt)
			continue
		}
		q.live++
		r.unlink(wt)
		r.handed[wt.jobID] = handoff{w: w, ticket: wt.ticket, at: now}
		c.Send(wt.pid, &Placed{JobID: wt.jobID, Ticket: wt.ticket, Reply: &PickReply{WorkerID: w.ID, Pool: w.Pool,
			Subject: p.Subject, Resend: p.Direct && w.Dedupe, StartsOnDelivery: !w.Reports}})
		placed++
	}
	for _, wt := range skipped {
		q.push(wt)
		q.live++
	}
	r.tidy([]string{w.Pool})
	if placed > 0 {
		r.changed(c, w)
	}
	return placed
}

// offerRoom offers the room left in pool's workers (this node's jobs have
// had their turn) to replicas that report jobs waiting for it.
func (r *Router) offerRoom(c actor.Context, pool string) {
	if len(r.peers) == 0 {
		return
	}
	now := r.now()
	ids := make([]string, 0, len(r.peers))
	for id := range r.peers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		p := r.peers[id]
		need := p.waiting[pool] - p.offered[pool]
		if need <= 0 || now.Before(p.declined[pool]) {
			continue
		}
		for need > 0 {
			w := r.reg.Top(pool)
			if w == nil || !r.reg.Live(w, now) || w.MaxParallel <= 0 {
				return
			}
			n := min(r.reg.Room(w), need)
			if n <= 0 {
				return
			}
			for range n {
				r.reg.CountDispatch(w) // held for the offer until its answer
			}
			r.offerSeq++
			r.offers[r.offerSeq] = &offer{to: id, pool: pool, w: w, n: n, at: now}
			r.outOffers = append(r.outOffers, Offer{To: id, ID: r.offerSeq, Worker: w.ID, N: n})
			p.offered[pool] += n
			need -= n
			r.changed(c, w)
		}
	}
}

// peerOffers takes the queue lengths, offers and answers in a replica's
// report.
func (r *Router) peerOffers(c actor.Context, from string, p *peer, m *PeerLoad) {
	grew := false
	for pool, n := range m.Waiting {
		if n != p.waiting[pool] {
			delete(p.declined, pool)
		}
		if n > p.waiting[pool] {
			grew = true
		}
	}
	p.waiting = m.Waiting
	if p.waiting == nil {
		p.waiting = map[string]int32{}
	}
	for _, a := range m.Acks {
		if a.To == r.cfg.NodeID {
			r.settle(c, from, p, a)
		}
	}
	for _, o := range m.Offers {
		if o.To == r.cfg.NodeID {
			r.useOffer(c, from, o)
		}
	}
	if grew {
		for pool, n := range p.waiting {
			if n > 0 && r.reg.Top(pool) != nil {
				r.offerRoom(c, pool)
			}
		}
	}
}

// useOffer places waiting jobs on the slots a replica offered, and answers.
func (r *Router) useOffer(c actor.Context, from string, o Offer) {
	a := OfferAck{To: from, ID: o.ID, Worker: o.Worker}
	if w := r.reg.Get(o.Worker); w != nil {
		a.Used = r.placeOn(c, w, o.N)
		a.Count = own(w)
	}
	r.outAcks = append(r.outAcks, a)
	r.kick(c)
}

// settle frees the slots of an answered offer; the replica's count, in the
// same report, now holds the ones it used.
func (r *Router) settle(c actor.Context, from string, p *peer, a OfferAck) {
	o := r.offers[a.ID]
	if o == nil || o.to != from {
		return
	}
	delete(r.offers, a.ID)
	p.offered[o.pool] = max(p.offered[o.pool]-o.n, 0)
	r.peerCount(c, p, a.Worker, a.Count)
	r.release(c, o)
	if a.Used < o.n {
		p.declined[o.pool] = r.now().Add(declineFor)
	}
}

// release gives an offer's slots back to this node's placement.
func (r *Router) release(c actor.Context, o *offer) {
	for range o.n {
		r.reg.CountDone(o.w)
	}
	r.changed(c, o.w)
	if r.reg.HasRoom(o.w) {
		r.drain(c, o.w.Pool)
	}
}

// expireOffers frees offers never answered.
func (r *Router) expireOffers(c actor.Context) {
	now := r.now()
	for id, o := range r.offers {
		if now.Sub(o.at) < OfferTTL {
			continue
		}
		delete(r.offers, id)
		if p := r.peers[o.to]; p != nil {
			p.offered[o.pool] = max(p.offered[o.pool]-o.n, 0)
		}
		r.log.Warn("capacity offer never answered; slots taken back", "to", o.to, "worker_id", o.w.ID, "slots", o.n)
		r.release(c, o)
	}
}

// waitingPerPool is this node's queue length per pool, for its reports.
func (r *Router) waitingPerPool() map[string]int32 {
	out := make(map[string]int32, len(r.queues))
	for p, q := range r.queues {
		if q.live > 0 {
			out[p] = int32(q.live)
		}
	}
	return out
}
