package lifecycle

import (
	"fmt"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// The simulator's model of the node's rate limiter (internal/ratelimit):
// one bucket "b" shared by the nodes (simRateBurst tokens, one more every
// simRateRefill), a FIFO queue of waiters per node, and a round per node
// every simRateRound while its queue is not empty: it grants tokens to the
// head of the queue in order and tells the others, once, that they wait.
// A dead node's queue goes with it. A waiter whose job parks keeps its
// place (ParkTokens) with no actor: its grant, or its Invalid, goes to the
// node, which spawns the job's next actor for it; a job's next actor asks
// again in its place, or leaves it. Now and then a pools reload is
// modelled: an ask is answered, or a waiter dropped and told, Invalid (the
// bucket removed or its burst cut). Invariants: every attempt of a
// rate-limited job (the first, and each retry: each calls the API again)
// is published only after a grant made to the job since its previous
// attempt was published; at the end no queue entry belongs to an actor
// that no longer waits.

const (
	simRateBurst  = 2
	simRateRefill = 3 * time.Second
	simRateRound  = 200 * time.Millisecond
	// simRateParkAfter: a wait for tokens parks after this long (shorter
	// than the node's ParkAfter, so that many waits park).
	simRateParkAfter = 2 * time.Second
	// simRateReload: about one ask or wait in this many meets a reload.
	simRateReload = 25
)

type simRateWaiter struct {
	a     *simActor
	job   string
	epoch uint64
	units int
	told  bool
	// parked: the job parked with its ask (a is nil); epoch is 0.
	parked bool
}

type simRate struct {
	tokens  int
	refilAt time.Time
	queues  map[*simNode][]*simRateWaiter
	round   map[*simNode]bool // a round is scheduled
	granted map[string]int    // grants sent to a job
	// since: grants sent to a job since its latest attempt was first
	// published, less the units it gave back; attempt: that attempt.
	since   map[string]int
	attempt map[string]int
	// sinceBy: the grants counted in since, by the epoch they were made
	// under (a give-back names it): a stale actor giving back a grant made
	// before the latest attempt's dispatch takes nothing from since (seed
	// 9100808: such a give-back hid the grant of the next attempt).
	sinceBy map[string]map[uint64]int
	retried int            // retries (attempts 2 and on) published after their grant
	parks   int            // asks parked
	invalid map[string]int // Invalid answers sent to a job (a reload)
}

// simRateLimit is the sim's Config.RateLimit: label "rate" names the bucket.
func simRateLimit(req *capv1.JobRequest) (string, int, string) {
	switch req.GetLabels()["rate"] {
	case "b":
		return "b", 1, ""
	case "bad":
		return "", 0, "rate limit bucket \"bad\" is not declared"
	}
	return "", 0, ""
}

func (s *sim) rateInit() {
	s.rate = simRate{tokens: simRateBurst, refilAt: s.now, queues: map[*simNode][]*simRateWaiter{},
		round: map[*simNode]bool{}, granted: map[string]int{}, invalid: map[string]int{},
		since: map[string]int{}, attempt: map[string]int{}, sinceBy: map[string]map[uint64]int{}}
}

// granted counts a grant to job made under epoch.
func (r *simRate) grant(job string, epoch uint64) {
	r.granted[job]++
	r.since[job]++
	if r.sinceBy[job] == nil {
		r.sinceBy[job] = map[uint64]int{}
	}
	r.sinceBy[job][epoch]++
}

// rateLabel gives some jobs a bucket (by a hash of their id of its own,
// so the other job kinds keep their share).
func rateLabel(req *capv1.JobRequest) {
	switch hash(req.JobId+"/rate") % 8 {
	case 0, 1:
		req.Labels["rate"] = "b"
	case 2:
		if hash(req.JobId+"/bad")%4 == 0 {
			req.Labels["rate"] = "bad"
		}
	}
}

func (s *sim) refill() {
	for !s.now.Before(s.rate.refilAt.Add(simRateRefill)) {
		s.rate.refilAt = s.rate.refilAt.Add(simRateRefill)
		if s.rate.tokens < simRateBurst {
			s.rate.tokens++
		}
	}
}

func (s *sim) takeTokens(n *simNode, a *simActor, e TakeTokens) any {
	q := s.rate.queues[n]
	for _, w := range q {
		if w.job == a.j.ID && (w.a == a || w.parked) {
			w.a, w.parked = a, false
			w.epoch = e.Epoch
			if w.told {
				return &Tokens{Epoch: e.Epoch, Bucket: e.Bucket, Units: e.Units}
			}
			return nil
		}
	}
	s.refill()
	if reloadHits(a.j.ID, "ask", e.Epoch) {
		s.rate.invalid[a.j.ID]++
		return &Tokens{Epoch: e.Epoch, Bucket: e.Bucket, Units: e.Units, Invalid: "bucket removed (sim reload)"}
	}
	if len(q) == 0 && s.rate.tokens >= e.Units && s.rng.IntN(2) == 0 {
		s.rate.tokens -= e.Units
		s.rate.grant(a.j.ID, e.Epoch)
		return &Tokens{Epoch: e.Epoch, Granted: true, Bucket: e.Bucket, Units: e.Units}
	}
	s.rate.queues[n] = append(q, &simRateWaiter{a: a, job: a.j.ID, epoch: e.Epoch, units: e.Units})
	s.rateRound(n)
	return nil
}

// reloadHits says whether a reload meets a job's ask (at) under epoch: by
// a hash of its own, not the run's random stream, so the seeds of the
// runs before reloads were modelled keep their course until one hits.
func reloadHits(job, at string, epoch uint64) bool {
	return hash(fmt.Sprint(job, "/reload/", at, "/", epoch))%simRateReload == 0
}

func (s *sim) leaveTokens(n *simNode, a *simActor, e LeaveTokens) {
	q := s.rate.queues[n]
	for i, w := range q {
		if w.job == a.j.ID && (w.a == a || w.parked) && w.epoch == e.Epoch {
			s.rate.queues[n] = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	if e.Return > 0 {
		s.rate.tokens = min(s.rate.tokens+e.Return, simRateBurst)
		// Only a grant made since the latest attempt's dispatch counts
		// against the next attempt when given back.
		if by := s.rate.sinceBy[a.j.ID]; by[e.Epoch] > 0 {
			by[e.Epoch]--
			s.rate.since[a.j.ID] = max(s.rate.since[a.j.ID]-e.Return, 0)
		}
	}
}

// parkTokens keeps a's ask in n's queue with no actor (epoch 0).
func (s *sim) parkTokens(n *simNode, a *simActor, e ParkTokens) {
	for _, w := range s.rate.queues[n] {
		if w.a == a && w.epoch == e.Epoch {
			w.a, w.parked, w.epoch, w.told = nil, true, 0, true
			s.rate.parks++
			return
		}
	}
}

// rateTell sends a rate answer to w: its actor, or, parked, the node.
func (s *sim) rateTell(n *simNode, w *simRateWaiter, t *Tokens) {
	if w.parked {
		s.send(&simMsg{node: n, job: w.job, at: s.now.Add(s.latency()), ev: t})
		return
	}
	s.send(&simMsg{node: n, actor: w.a, job: w.job, at: s.now.Add(s.latency()), ev: t})
}

// rateRound schedules n's next round, if none is.
func (s *sim) rateRound(n *simNode) {
	if s.rate.round[n] {
		return
	}
	s.rate.round[n] = true
	s.after(simRateRound+s.latency(), func() {
		s.rate.round[n] = false
		if !n.alive {
			delete(s.rate.queues, n) // the node's memory went with it
			return
		}
		s.refill()
		q := s.rate.queues[n]
		// An actor gone from the node is a waiter nobody will tell (its
		// limiter's queue went with the actor's Leave, or the node).
		live := q[:0]
		for _, w := range q {
			if w.parked || n.live[w.job] == w.a {
				live = append(live, w)
			}
		}
		q = live
		// A reload drops a waiter (any place in the queue) and tells it.
		for i, w := range q {
			if reloadHits(w.job, "wait", w.epoch) {
				q = append(q[:i:i], q[i+1:]...)
				s.rate.invalid[w.job]++
				s.rateTell(n, w, &Tokens{Epoch: w.epoch, Bucket: "b", Units: w.units, Invalid: "bucket removed (sim reload)"})
				break
			}
		}
		for len(q) > 0 && q[0].units <= s.rate.tokens {
			w := q[0]
			q = q[1:]
			s.rate.tokens -= w.units
			s.rate.grant(w.job, w.epoch)
			s.rateTell(n, w, &Tokens{Epoch: w.epoch, Granted: true, Bucket: "b", Units: w.units})
		}
		for _, w := range q {
			if !w.told {
				w.told = true
				s.send(&simMsg{node: n, actor: w.a, job: w.job, at: s.now.Add(s.latency()),
					ev: &Tokens{Epoch: w.epoch, Bucket: "b", Units: w.units}})
			}
		}
		s.rate.queues[n] = q
		if len(q) > 0 {
			s.rateRound(n)
		}
	})
}

// checkRateDispatch: a rate-limited job's attempt, first published, follows
// a grant made since the job's previous attempt was (a retry that reused
// its first attempt's grant called the API more often than the bucket
// allows). The same attempt published again (a failed publish, a worker
// lost before it ran) takes none; an attempt number lower than the last
// (a record Redis lost, submitted again) is left out.
func (s *sim) checkRateDispatch(a *simActor) {
	b, _, _ := simRateLimit(a.j.Req)
	n := a.j.Attempt()
	if b == "" || n <= s.rate.attempt[a.j.ID] {
		return
	}
	if s.rate.since[a.j.ID] == 0 {
		s.fail("%s: attempt %d dispatched with no grant of bucket %s since attempt %d", a.j.ID, n, b, s.rate.attempt[a.j.ID])
	}
	if n > 1 {
		s.rate.retried++
	}
	s.rate.attempt[a.j.ID], s.rate.since[a.j.ID] = n, 0
	delete(s.rate.sinceBy, a.j.ID)
}

// checkRateQueues: after the calm, no waiter is left in a queue.
func (s *sim) checkRateQueues() {
	for n, q := range s.rate.queues {
		for _, w := range q {
			if n.live[w.job] == w.a && w.a.j.RateWait() == "" {
				s.fail("%s: still queued on %s for tokens it does not wait for", w.job, n.id)
			}
		}
	}
}
