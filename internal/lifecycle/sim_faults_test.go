package lifecycle

import (
	"slices"
	"strconv"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The simulator's periodic work (lock renewal, due and parked polls) and
// the faults it injects.

// tick is a node's periodic work: lock renewal (and loss reports), the
// parked poll.
func (s *sim) tick(n *simNode) {
	s.after(simTick*5, func() { s.tick(n) })
	if !n.alive || s.now.Before(n.pausedUntil) {
		return
	}
	ids := make([]string, 0, len(n.held))
	for id := range n.held {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		lv := n.held[id]
		switch got := s.renew(id, lv); {
		case got == 1:
		case n.live[id] != nil:
			delete(n.held, id)
			s.send(&simMsg{node: n, job: id, at: s.now, ev: &LockLost{LockValue: lv, Vanished: got < 0}})
		default:
			delete(n.held, id)
		}
	}
}

// renew is the renewal script (renew_many.lua) for one lock: 1 renewed, 0
// the lock is another's, -1 there is none.
func (s *sim) renew(id, lv string) int {
	r := s.recs[id]
	switch {
	case r == nil:
		return -1
	case r.lock == lv && s.now.Before(r.lockExp):
		r.lockExp, r.lease = s.now.Add(simLockTTL), true
		return 1
	case s.lockKey(r) != "":
		return 0
	}
	return -1
}

// dueTick is every node's due poller and the dead-node adoption: jobs due,
// jobs whose lease lapsed, parked jobs due or of a dead node are woken.
func (s *sim) dueTick() {
	s.after(simTick, s.dueTick)
	alive := s.aliveNodes()
	if len(alive) == 0 {
		return
	}
	ids := make([]string, 0, len(s.recs))
	for id := range s.recs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		r := s.recs[id]
		if r.state.Terminal() {
			continue
		}
		wake := false
		var to *simNode
		switch {
		case r.parkedBy != "":
			pn := s.node(r.parkedBy)
			d, _ := strconv.ParseInt(r.fields["park_due"], 10, 64)
			if !pn.alive {
				wake = true
			} else if d > 0 && s.now.UnixMilli() >= d && !s.now.Before(pn.pausedUntil) {
				wake, to = true, pn
			}
		case s.lockHeld(r):
		case r.due > 0 && s.now.UnixMilli() >= r.due:
			wake = true
		case r.lease:
			wake = true // the owner stopped renewing: its lease lapsed
		}
		if !wake {
			continue
		}
		if to == nil {
			to = alive[s.rng.IntN(len(alive))]
		}
		s.send(&simMsg{node: to, job: id, spawn: true, at: s.now.Add(s.latency()), ev: &Wake{}})
	}
}

// fault injects one fault at random.
func (s *sim) fault() {
	switch s.rng.IntN(15) {
	case 0: // a node dies
		n := s.nodes[s.rng.IntN(len(s.nodes))]
		if !n.alive || len(s.aliveNodes()) == 1 {
			return
		}
		s.logf("fault: %s dies", n.id)
		n.alive = false
		n.live, n.held, n.queue, n.picks, n.parked = map[string]*simActor{}, map[string]string{}, map[string]uint64{},
			map[string]string{}, map[string]bool{}
		n.alone = map[string]simAlone{} // its waits left alone are no longer known (a double fault with a loss)
		for _, id := range sortedKeys(s.lostBy) {
			if s.lostBy[id] == n && s.lostAlone[id] {
				// Its sweep's wake died with it before the job ended: the
				// same double fault.
				s.lostAlone[id] = false
				s.aloneDied++
			}
		}
		delete(s.rate.queues, n) // the limiter's memory goes with the node
		s.after(time.Duration(5+s.rng.IntN(60))*time.Second, func() {
			s.logf("fault: %s restarts", n.id)
			n.alive = true
			for id, r := range s.recs {
				if r.parkedBy == n.id && r.state == jobstate.StateDispatched {
					n.parked[id] = true
				}
				if r.parkedBy == n.id && r.state == jobstate.StateScheduled {
					// Parked waiting for tokens: the limiter's queue died
					// with the process; the job is woken to ask again.
					s.send(&simMsg{node: n, job: id, spawn: true, at: s.now.Add(s.latency()), ev: &Wake{}})
				}
			}
		})
	case 1: // a node pauses (SIGSTOP) past the lock TTL, sometimes
		n := s.nodes[s.rng.IntN(len(s.nodes))]
		if n.alive {
			n.pausedUntil = s.now.Add(time.Duration(s.rng.IntN(45)) * time.Second)
			s.logf("fault: %s paused until %s", n.id, n.pausedUntil.Format("15:04:05"))
		}
	case 2: // an actor crashes and is restarted
		n := s.nodes[s.rng.IntN(len(s.nodes))]
		for _, id := range sortedKeys(n.live) {
			a := n.live[id]
			s.logf("fault: actor %s on %s restarts", id, n.id)
			s.step(n, a, &Restarting{})
			n.live[id] = &simActor{j: New(s.nodeCfg(n), id, s.rng.Uint64())}
			break
		}
	case 3: // a lock expires under its owner
		for _, id := range sortedKeys(s.recs) {
			r := s.recs[id]
			if r.lock != "" && r.parkedBy == "" && s.rng.IntN(4) == 0 {
				s.logf("fault: lock of %s expires", id)
				r.lock = ""
				break
			}
		}
	case 4: // Redis loses its data
		if s.rng.IntN(5) == 0 {
			s.logf("fault: redis loses its data")
			s.recs, s.idem, s.tenant, s.terminal = map[string]*simRec{}, map[string]string{}, map[string]bool{},
				map[string]jobstate.State{}
			s.tenantAt = map[string]int64{}
			s.dataLostAt = s.now
			s.losses++
			lostAt := s.now
			s.after(simLostSweep, func() { s.sweepAlone(lostAt) })
		}
	case 5: // a worker dies; every node's router evicts it
		w := s.workers[s.rng.IntN(len(s.workers))]
		if !w.alive {
			return
		}
		s.logf("fault: worker %s dies", w.id)
		w.alive, w.running = false, map[string]bool{}
		s.evict(w)
		s.after(time.Duration(5+s.rng.IntN(60))*time.Second, func() { w.alive, w.done = true, map[string]capv1.JobStatus{} })
	case 6: // a worker is evicted although alive (its node or itself paused)
		w := s.workers[s.rng.IntN(len(s.workers))]
		if w.alive {
			s.logf("fault: worker %s evicted while alive", w.id)
			s.evict(w)
		}
	case 7: // the kernel goes down, for a moment or for long
		d := time.Duration(s.rng.IntN(600)) * time.Second
		s.kernelDownUntil = s.now.Add(d)
		s.logf("fault: kernel down for %s", d)
	case 8: // the clock jumps
		s.now = s.now.Add(time.Duration(s.rng.IntN(120)) * time.Second)
		s.logf("fault: clock jumps")
	case 9, 10: // a client cancels a job
		if len(s.jobs) > 0 {
			id := s.jobs[s.rng.IntN(len(s.jobs))]
			s.deliverNew(id, &Cancel{C: &capv1.JobCancel{JobId: id, Reason: "sim", RequestedBy: "client"}, TraceID: "tr-" + id})
		}
	case 11: // JetStream redelivers an acked message
		if len(s.jobs) > 0 {
			id := s.jobs[s.rng.IntN(len(s.jobs))]
			if subs := s.subs[id]; len(subs) > 0 {
				d := subs[0]
				s.send(&simMsg{anyNode: true, job: id, ev: d.ev, spawn: true, at: s.now.Add(s.latency())})
			}
		}
	case 12: // the result stream is lost with the results it held
		s.loseResults()
	default: // a human decides an approval
		s.decideApprovals(s.rng.IntN(2) == 0)
	}
}

// loseResults: the result stream is deleted (or lost with a JetStream
// store) and recreated. The results it held and no node had acked are gone;
// then every node's keeper notices the new stream and tells the jobs it
// owns that are live or parked there (ResultsLost).
func (s *sim) loseResults() {
	lost := map[*simDelivery]bool{}
	for _, d := range s.deliveries {
		if _, ok := d.ev.(*Result); ok && !d.done {
			d.done, d.holder = true, nil // gone with the stream: nobody will ack it
			lost[d] = true
		}
	}
	kept := s.net[:0]
	for _, m := range s.net {
		if r, ok := m.ev.(*Result); ok && lost[r.Delivery.(*simDelivery)] {
			continue
		}
		kept = append(kept, m)
	}
	s.net = kept
	s.logf("fault: result stream lost (%d results)", len(lost))
	for _, n := range s.aliveNodes() {
		for _, id := range sortedKeys(n.live) {
			s.send(&simMsg{node: n, job: id, at: s.now.Add(s.latency()), ev: &ResultsLost{}})
		}
		for _, id := range sortedKeys(s.recs) {
			if r := s.recs[id]; r.parkedBy == n.id && n.live[id] == nil && active(r.state) {
				s.send(&simMsg{node: n, job: id, spawn: true, at: s.now.Add(s.latency()), ev: &ResultsLost{}})
			}
		}
	}
}

func (s *sim) decideApprovals(approve bool) {
	for _, id := range sortedKeys(s.recs) {
		r := s.recs[id]
		if r.state != jobstate.StateApprovalRequired || r.fields["approval_decision"] != "" {
			continue
		}
		dec := jobstate.DecisionRejected
		if approve {
			dec = jobstate.DecisionApproved
			r.fields["approval_hash"] = r.fields["job_hash"]
		}
		r.fields["approval_decision"], r.fields["approval_by"] = string(dec), "sim"
		r.due = s.now.UnixMilli()
		return
	}
}

func (s *sim) evict(w *simWorker) {
	for _, n := range s.aliveNodes() {
		for _, id := range sortedKeys(n.picks) {
			if n.picks[id] != w.id {
				continue
			}
			delete(n.picks, id)
			if s.lostSent[id] == nil {
				s.lostSent[id] = map[string]bool{}
			}
			s.lostSent[id][w.id] = true
			s.send(&simMsg{node: n, job: id, at: s.now.Add(s.latency()), ev: &WorkerLost{WorkerID: w.id}})
		}
	}
}

// simLostSweep: when a node's sweep of its waits left alone runs after a
// loss — the epoch check at its next lease renewal, then a lock TTL;
// simAloneGrace: a retry wait due this long before the loss had been woken
// (the node's cut, aloneGrace: its index drops such waits).
const (
	// simVerifyTick: how soon a node drops its entry for a wait that left
	// it elsewhere (the verify of approvals and rate parks; retry waits
	// are cut by their due time).
	simVerifyTick = 20 * time.Second
	// simDataLostFor: how long after a loss DataLost holds (a node's: the
	// retention of terminal records, an hour at least).
	simDataLostFor = 10 * time.Minute
	simLostSweep   = 25 * time.Second
	simAloneGrace  = 30 * time.Second
)

// sweepAlone: every live node wakes, as lost, each wait it left alone
// whose record is gone (the node's sweep, alone_node.go), but for retry
// waits due before lostAt less the grace.
func (s *sim) sweepAlone(lostAt time.Time) {
	for _, n := range s.aliveNodes() {
		for _, id := range sortedKeys(n.alone) {
			due := n.alone[id].due
			if s.recs[id] != nil {
				continue // woken since (live somewhere, written back) or ended
			}
			delete(n.alone, id)
			if !due.IsZero() && due.Before(lostAt.Add(-simAloneGrace)) {
				continue
			}
			s.logf("sweep: %s wakes its lost wait %s", n.id, id)
			if s.everEnded[id] {
				s.aloneAfterEnd++
			}
			if s.toldLost[id] == 0 {
				s.lostAlone[id], s.lostBy[id] = true, n
			}
			s.send(&simMsg{node: n, job: id, spawn: true, at: s.now.Add(s.latency()), ev: &Wake{Lost: true}})
		}
	}
}

// checkLostAlone: a wait left alone whose record Redis lost, and which a
// node's sweep woke, ends visibly after the wake: written again (a
// record, which the calm ends), ended, or dead-lettered state_lost with its
// client told.
func (s *sim) checkLostAlone() {
	for _, id := range sortedKeys(s.lostAlone) {
		if s.lostAlone[id] && s.recs[id] == nil { // see lostAlonePending
			s.fail("%s: a wait left alone whose record Redis lost never ended (no record, no state_lost tell)", id)
		}
	}
}

// lostAlonePending reports whether a wait woken lost has not ended yet.
func (s *sim) lostAlonePending() bool {
	for id, pending := range s.lostAlone {
		if pending && s.recs[id] == nil {
			return true
		}
	}
	return false
}

// alone reports whether the record is in a wait a node leaves alone: a
// retry wait, an approval, a rate-limited park.
func (r *simRec) alone() bool {
	switch {
	case r.state == jobstate.StateApprovalRequired:
		return true
	case r.state == jobstate.StateScheduled:
		reason := jobstate.Reason(r.fields["reason"])
		return reason == jobstate.ReasonRetryWait || reason == jobstate.ReasonRateLimited
	}
	return false
}
