package lifecycle

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The simulator's models of what surrounds a job: the store's scripts,
// JetStream deliveries, the router, the input policy and the workers.

// simRec is a job's record, lock and wait entries as the store holds them.
type simRec struct {
	state    jobstate.State
	fence    int64
	lock     string // "" none; "<node>|<fence>" or "<node>|<fence>|p"
	lockExp  time.Time
	parkedBy string
	fields   map[string]string
	op       string
	due      int64 // unix ms; 0 none
	lease    bool
}

type simDelivery struct {
	s      *sim
	ev     any // *Submit, *Result or *Cancel
	job    string
	done   bool // acked
	holder *simNode
	heldAt time.Time
}

func (d *simDelivery) Ack() error { d.done, d.holder = true, nil; return nil }
func (d *simDelivery) NakWithDelay(delay time.Duration) error {
	if d.done {
		return nil
	}
	d.holder = nil
	d.s.send(&simMsg{anyNode: true, job: d.job, ev: d.ev, spawn: true, at: d.s.now.Add(max(delay, time.Millisecond))})
	return nil
}
func (d *simDelivery) InProgress() error { d.heldAt = d.s.now; return nil }

type simActor struct {
	j          *Job
	timerAt    time.Time
	timerEpoch uint64
	// grace: the actor's waits within the capacity grace (Grace effects'
	// sum, 0 or 1); admitted: an Admitted was emitted in the current one.
	grace    int64
	admitted bool
	// rec: the record the actor's last write met in the store (nil: none
	// then), as its reply tells it; a relay is counted against it.
	rec *simRec
}

type simNode struct {
	id          string
	alive       bool
	pausedUntil time.Time
	live        map[string]*simActor
	parked      map[string]bool
	held        map[string]string // renewer: job → lock value
	queue       map[string]uint64 // router wait queue: job → ticket
	picks       map[string]string // router in-flight: job → worker
	// alone: the node's index of waits it left alone (Alone; a Hold here
	// drops one), swept after Redis loses its data (simLostSweep).
	alone map[string]simAlone
}

// simAlone is a node's entry for a wait it left alone.
type simAlone struct {
	due time.Time // a retry wait's retry time (zero: none)
	at  time.Time // when it was indexed
}

type simWorker struct {
	id      string
	alive   bool
	stock   bool // no progress, no cancels
	dedupe  bool
	pool    bool // reached on the pool subject
	running map[string]bool
	// done: the jobs it finished, with their outcome (a deduping worker
	// sends it again when a finished job is delivered again).
	done map[string]capv1.JobStatus
}

// simMsg is something in flight: an event for a job on a node (anyNode: on
// whichever live node takes it), or a reply for one actor.
type simMsg struct {
	node    *simNode
	anyNode bool
	actor   *simActor // replies: only this actor takes it
	job     string
	ev      any
	spawn   bool
	at      time.Time
	seq     int
	fn      func()  // a model action instead of an event (ticks, workers)
	rec     *simRec // a write's reply: the record the write met
}

// policy answers a check: down during an outage; else by the job's label.
func (s *sim) policy(id string, req *capv1.JobRequest, ep uint64) *PolicyDone {
	if s.now.Before(s.kernelDownUntil) {
		return &PolicyDone{Epoch: ep, Err: errors.New("kernel unavailable")}
	}
	dec := &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}
	switch req.GetLabels()["policy"] {
	case "deny":
		s.denies[id] = true
		dec.Decision = capv1.DecisionType_DECISION_TYPE_DENY
	case "approve":
		dec.Decision = capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN
	case "throttle":
		if s.rng.IntN(2) == 0 {
			dec.Decision = capv1.DecisionType_DECISION_TYPE_THROTTLE
		}
	}
	return &PolicyDone{Epoch: ep, Dec: dec}
}

// pick answers a PickRequest: a worker, a wait in the queue, or a refusal.
func (s *sim) pick(n *simNode, a *simActor, req *PickRequest) {
	reply := &PickReply{Epoch: req.Epoch}
	var live []*simWorker
	for _, w := range s.workers {
		if w.alive {
			live = append(live, w)
		}
	}
	switch r := s.rng.IntN(100); {
	case len(live) == 0 || r < 8:
		reply.Queued, reply.Reason = true, jobstate.ReasonNoWorkers
	case r < 25:
		reply.Queued, reply.Reason = true, jobstate.ReasonPoolOverloaded
	case r < 28:
		reply.Reason, reply.Detail = jobstate.ReasonTopicUnmapped, "no route yet"
	default:
		w := live[s.rng.IntN(len(live))]
		reply.WorkerID, reply.Subject = w.id, "worker."+w.id+".jobs"
		if w.pool {
			reply.Subject = "job.sim"
		}
		reply.Resend = w.dedupe && !w.pool
		reply.StartsOnDelivery = w.stock
		n.picks[req.JobID] = w.id
	}
	if reply.Queued {
		n.queue[req.JobID] = req.Ticket
		ticket, job := req.Ticket, req.JobID
		s.after(time.Duration(50+s.rng.IntN(3000))*time.Millisecond, func() { s.place(n, job, ticket) })
	}
	s.send(&simMsg{node: n, actor: a, job: req.JobID, ev: reply, at: s.now.Add(s.latency())})
}

// place: a slot freed for a queued job.
func (s *sim) place(n *simNode, job string, ticket uint64) {
	if !n.alive || n.queue[job] != ticket {
		return
	}
	for _, w := range s.workers {
		if w.alive {
			delete(n.queue, job)
			n.picks[job] = w.id
			subj := "worker." + w.id + ".jobs"
			if w.pool {
				subj = "job.sim"
			}
			s.send(&simMsg{node: n, job: job, at: s.now.Add(s.latency()), ev: &Placed{JobID: job, Ticket: ticket,
				Reply: &PickReply{WorkerID: w.id, Subject: subj, Resend: w.dedupe && !w.pool, StartsOnDelivery: w.stock}}})
			return
		}
	}
	s.after(time.Second, func() { s.place(n, job, ticket) })
}

// reach delivers a published request: to the named worker, or on a pool
// subject to whichever pool worker NATS chooses; sometimes it is lost.
func (s *sim) reach(job, worker, subject string) {
	if s.faults && s.rng.IntN(40) == 0 {
		return // lost on the wire
	}
	var w *simWorker
	if subject == "job.sim" {
		var pool []*simWorker
		for _, x := range s.workers {
			if x.pool && x.alive {
				pool = append(pool, x)
			}
		}
		if len(pool) == 0 {
			return
		}
		w = pool[s.rng.IntN(len(pool))]
	} else {
		for _, x := range s.workers {
			if x.id == worker && x.alive {
				w = x
			}
		}
	}
	if w == nil {
		return
	}
	// job is the id the worker knows (an attempt id for a job that may
	// retry); its answers go to the job it names.
	base, _ := jobstate.SplitAttempt(job)
	if st, done := w.done[job]; w.dedupe && (w.running[job] || done) {
		if w.running[job] {
			s.progress(job, w)
		} else {
			s.resent++
			s.deliverNew(base, &Result{Res: &capv1.JobResult{JobId: job, Status: st, WorkerId: w.id}, TraceID: "tr-" + base})
		}
		return
	}
	w.running[job] = true
	if !w.stock {
		s.after(time.Duration(10+s.rng.IntN(500))*time.Millisecond, func() {
			if w.alive && w.running[job] {
				s.progress(job, w)
			}
		})
	}
	run := time.Duration(100+s.rng.IntN(20_000)) * time.Millisecond
	if s.rng.IntN(20) == 0 {
		run = time.Duration(s.rng.IntN(15)) * time.Minute
	}
	s.after(run, func() {
		if !w.alive || !w.running[job] {
			return
		}
		delete(w.running, job)
		st := capv1.JobStatus_JOB_STATUS_SUCCEEDED
		switch r := s.rng.IntN(10); {
		case r == 0:
			st = capv1.JobStatus_JOB_STATUS_FAILED
		case r < 5 && base != job: // attempts of jobs that retry fail often
			st = capv1.JobStatus_JOB_STATUS_FAILED
			if r == 4 {
				st = capv1.JobStatus_JOB_STATUS_TIMEOUT
			}
		}
		w.done[job] = st
		// An attempt dispatched more than once (re-placed before it was
		// known started) may fail at one worker and succeed at another: a
		// failure, once sent, stays what the attempt's retry may rest on.
		if prev, ok := s.attemptSent[job]; !ok || prev != capv1.JobStatus_JOB_STATUS_FAILED && prev != capv1.JobStatus_JOB_STATUS_TIMEOUT {
			s.attemptSent[job] = st
		}
		s.deliverNew(base, &Result{Res: &capv1.JobResult{JobId: job, Status: st, WorkerId: w.id}, TraceID: "tr-" + base})
	})
}

func (s *sim) progress(job string, w *simWorker) {
	base, _ := jobstate.SplitAttempt(job)
	for _, n := range s.aliveNodes() {
		s.send(&simMsg{node: n, job: base, at: s.now.Add(s.latency()),
			ev: &Progress{P: &capv1.JobProgress{JobId: job, Status: capv1.JobStatus_JOB_STATUS_RUNNING}, From: w.id}})
	}
}

// writeFault runs op against the store model, with the faults a real
// Redis brings: unavailable (nothing applied) or a reply lost after the
// write applied — both seen as an error.
func (s *sim) writeFault(n *simNode, op *Op) *WriteResult {
	if s.faults {
		switch s.rng.IntN(60) {
		case 0:
			return &WriteResult{Err: errors.New("redis: connection refused")}
		case 1:
			s.apply(n, op)
			return &WriteResult{Err: errors.New("redis: i/o timeout")}
		}
	}
	return s.apply(n, op)
}

// apply is the store's scripts, as a model.
func (s *sim) apply(n *simNode, op *Op) *WriteResult {
	r := s.recs[op.JobID]
	switch op.Kind {
	case OpClaim:
		h, ok := s.idem[op.IdemKey]
		if !ok {
			s.idem[op.IdemKey], h = op.JobID, op.JobID
		}
		return &WriteResult{Holder: h}
	case OpAdmit:
		used := 0
		for _, v := range s.tenant {
			if v {
				used++
			}
		}
		if s.tenant[op.JobID] || used < op.Limit {
			if !s.tenant[op.JobID] {
				s.admittedIn[op.JobID] = s.losses
			}
			// Asking again moves the slot's score to now (admit.lua).
			s.tenantAt[op.JobID] = s.now.UnixMilli()
			s.tenant[op.JobID] = true
			return &WriteResult{Admitted: true}
		}
		return &WriteResult{}
	case OpDLQ:
		s.dlq++
		return &WriteResult{}
	case OpRelease:
		if r != nil && r.lock == op.LockValue && s.now.Before(r.lockExp) {
			if r.state == jobstate.StateScheduled && r.fields["reason"] == string(jobstate.ReasonRetryWait) {
				s.retryWaitParked(op.JobID, r)
			}
			r.lock, r.lease = "", false
			return &WriteResult{Released: true}
		}
		return &WriteResult{}
	case OpPark:
		if r == nil || r.lock != op.LockValue || !s.now.Before(r.lockExp) {
			return &WriteResult{}
		}
		r.lock, r.parkedBy, r.lease, r.due = op.LockValue+"|p", n.id, false, 0
		r.fields["park_due"] = strconv.FormatInt(op.ParkDue, 10)
		return &WriteResult{Parked: true}
	case OpActivate:
		return s.activate(n, op, r)
	case OpTransition:
		if r == nil || (r.lock != op.LockValue || (r.parkedBy == "" && !s.now.Before(r.lockExp))) {
			res := &WriteResult{Step: StepFenced}
			if r != nil {
				// The lock's value as Redis holds it: a parked lock stays
				// (whether or not its node's lease lapsed), a TTL lock
				// lapses.
				res.Before = jobstate.State(s.lockKey(r))
				res.LastOp, res.State = r.op, r.state
			}
			return res
		}
		if !slices.Contains(strings.Split(op.T.Expect, ","), string(r.state)) {
			return &WriteResult{Step: StepConflict, Before: r.state, LastOp: r.op}
		}
		if op.TenantRelease != "" {
			delete(s.tenant, op.JobID)
			delete(s.tenantAt, op.JobID)
		}
		if op.DLQ != nil {
			s.dlq++
		}
		before := r.state
		s.path(op.JobID, r, op.T)
		return &WriteResult{Step: StepOK, Before: before}
	}
	return &WriteResult{}
}

// lockKey is rec's lock value as Redis's lock key holds it ("" when it
// lapsed): a parked lock has no TTL, whether or not its node is alive.
func (s *sim) lockKey(r *simRec) string {
	if r.parkedBy == "" && !s.now.Before(r.lockExp) {
		return ""
	}
	return r.lock
}

func (s *sim) activate(n *simNode, op *Op, r *simRec) *WriteResult {
	if r != nil && s.lockHeld(r) {
		owner, _, _ := strings.Cut(r.lock, "|")
		if owner != n.id {
			return &WriteResult{Status: ActivateBusy, State: r.state, Holder: r.lock}
		}
	}
	holder := ""
	if r != nil {
		holder = r.lock
		if !s.lockHeld(r) && r.parkedBy == "" {
			holder = ""
		}
		if r.parkedBy != "" {
			r.parkedBy = ""
			if d, _ := strconv.ParseInt(r.fields["deadline"], 10, 64); d > 0 && !r.state.Terminal() {
				r.due = d
			}
		}
	}
	if r == nil {
		if !op.Create {
			return &WriteResult{Status: ActivateNotFound}
		}
		r = &simRec{state: jobstate.StatePending, fence: 1, fields: map[string]string{"req": string(op.Request),
			"trace": op.TraceID, "created": strconv.FormatInt(s.now.UnixMilli(), 10), "reason": string(jobstate.ReasonSubmitted)}}
		s.recs[op.JobID] = r
		r.due = s.now.Add(simRescue).UnixMilli()
		t := op.T
		if t != nil {
			s.path(op.JobID, r, t)
		}
		if t == nil || t.LockKept() {
			r.lock, r.lockExp, r.lease = jobstate.LockValue(n.id, 1), s.now.Add(simLockTTL), true
		} else {
			r.lock, r.lease = "", false
		}
		if op.DLQ != nil {
			s.dlq++
		}
		return &WriteResult{Status: ActivateCreated, State: r.state, Fence: 1}
	}
	if r.state.Terminal() {
		r.due, r.lease = 0, false
		return &WriteResult{Status: ActivateTerminal, State: r.state, Holder: holder}
	}
	r.fence++
	r.lock, r.lockExp, r.lease = jobstate.LockValue(n.id, r.fence), s.now.Add(simLockTTL), true
	// The record's fields as activate.lua reads them, its state ("s")
	// among them.
	f := map[string]string{"reason": r.fields["reason"], "op": r.op, "s": string(r.state)}
	for k, v := range r.fields {
		f[k] = v
	}
	return &WriteResult{Status: ActivateAdopted, State: r.state, Fence: r.fence, Holder: holder, Fields: f}
}

// path applies a transition's hops to a record and checks the hop rules.
func (s *sim) path(id string, r *simRec, t *jobstate.Transition) {
	if prev, ok := s.terminal[id]; ok {
		s.fail("%s: terminal %s changed by %v", id, prev, t.Path)
	}
	from := r.state
	for _, h := range t.Path {
		if h.Reason == "" {
			s.fail("%s: hop %s → %s has no reason", id, from, h.To)
		}
		if h.To == jobstate.StateDispatched {
			s.dispatchHops[id]++
			if h.Reason == jobstate.ReasonDispatched {
				delete(s.lostActive, id) // dispatched again, on a slot asked for anew
				delete(s.withheld, id)
				s.tenantDispatch(id)
			}
		}
		if h.Reason == jobstate.ReasonStateLost {
			s.rewrittenIn[id] = s.losses
		}
		if h.Reason == jobstate.ReasonStateLost && (h.To == jobstate.StateDispatched || h.To == jobstate.StateRunning) {
			s.lostActive[id] = true
		}
		if h.Reason == jobstate.ReasonRetryWait {
			s.retryHop(id, r, from, t)
		} else if from == jobstate.StateDispatched && h.To == jobstate.StateScheduled {
			switch h.Reason {
			case jobstate.ReasonWorkerLost:
				if !s.lostSent[id][r.fields["worker"]] {
					s.fail("%s: worker_lost for %s, which nobody reported lost", id, r.fields["worker"])
				}
			case jobstate.ReasonDispatchFailed:
				if !s.pubFailed[id] {
					s.fail("%s: dispatch_failed with no failed publish", id)
				}
			case jobstate.ReasonStateLost:
			case jobstate.ReasonConcurrencyKey, jobstate.ReasonTenantLimit:
				if !s.withheld[id] {
					s.fail("%s: DISPATCHED → SCHEDULED for %s, its dispatch not withheld", id, h.Reason)
				}
				delete(s.withheld, id)
			default:
				s.fail("%s: DISPATCHED → SCHEDULED for %s", id, h.Reason)
			}
		}
		from = h.To
	}
	for i := 0; i+1 < len(t.Fields); i += 2 {
		v := t.Fields[i+1]
		if v == jobstate.LandedNow {
			v = strconv.FormatInt(s.now.UnixMilli(), 10) // the script's TIME: when the write lands
		}
		r.fields[t.Fields[i]] = v
	}
	r.state = t.Final()
	r.fields["reason"] = string(t.Path[len(t.Path)-1].Reason)
	r.op = t.Op
	if r.state.Terminal() && s.jobRetries(id) {
		s.endedByCurrentAttempt(id, r)
	}
	switch {
	case r.state.Terminal():
		r.due, r.lock, r.lease = 0, "", false
		s.terminal[id] = r.state
		s.everEnded[id] = true
		if s.lostAlone[id] {
			s.lostAlone[id] = false // ended visibly after its wake
		}
		s.outcomes[string(r.state)+":"+r.fields["reason"]]++
		last := r.fields["last_reason"]
		if r.state == jobstate.StateFailed && last == string(jobstate.ReasonSafetyUnavailable) {
			s.fail("%s: FAILED because the input policy was unavailable", id)
		}
		if r.state == jobstate.StateFailed && r.fields["reason"] == string(jobstate.ReasonWorkerLost) && !s.lostSent[id][r.fields["worker"]] {
			s.fail("%s: FAILED worker_lost, but nobody reported %s lost", id, r.fields["worker"])
		}
		if r.state == jobstate.StateDenied && !s.denies[id] && !strings.HasPrefix(r.fields["reason"], "approval") {
			s.fail("%s: DENIED (%s) though the policy never denied it", id, r.fields["reason"])
		}
	case t.Due == -1:
		r.due = 0
	case t.Due > 0:
		r.due = t.Due
	}
	if t.Release && !r.state.Terminal() {
		r.lock, r.lease = "", false
	}
}

// retryWaitParked checks a retry wait whose lock is about to be released
// (it parks): its due entry, written with the wait, is what brings it back
// at its retry time, so it must be there.
func (s *sim) retryWaitParked(id string, r *simRec) {
	s.retryParks++
	at, err := strconv.ParseInt(r.fields[jobstate.FieldRetryAt], 10, 64)
	if err != nil || r.due <= 0 || r.due > at {
		s.fail("%s: a retry wait parks with due %d, retry_at %q", id, r.due, r.fields[jobstate.FieldRetryAt])
	}
}

// jobRetries: the job's submit asked for retries (simRetryAttempts).
func (s *sim) jobRetries(id string) bool { return hash(id)%20 >= 10 && hash(id)%20 <= 12 }

// retryHop checks a retry: only a job that retries, out of DISPATCHED or
// RUNNING, after its current attempt's worker sent FAILED or TIMEOUT or was
// reported lost, to the next attempt, within the policy's attempts.
func (s *sim) retryHop(id string, r *simRec, from jobstate.State, t *jobstate.Transition) {
	cur, _ := strconv.Atoi(r.fields[jobstate.FieldTry])
	cur = max(cur, 1)
	next := 0
	for i := 0; i+1 < len(t.Fields); i += 2 {
		if t.Fields[i] == jobstate.FieldTry {
			next, _ = strconv.Atoi(t.Fields[i+1])
		}
	}
	st, sent := s.attemptSent[jobstate.AttemptID(id, cur)]
	failed := sent && (st == capv1.JobStatus_JOB_STATUS_FAILED || st == capv1.JobStatus_JOB_STATUS_TIMEOUT)
	switch {
	case !s.jobRetries(id):
		s.fail("%s: retried, but its policy runs it once", id)
	case from != jobstate.StateDispatched && from != jobstate.StateRunning:
		s.fail("%s: retry_wait from %s", id, from)
	case next != cur+1 || next > simRetryAttempts:
		s.fail("%s: retry from attempt %d to %d (at most %d)", id, cur, next, simRetryAttempts)
	case !failed && !s.lostSent[id][r.fields["worker"]]:
		s.fail("%s: attempt %d retried, but its worker neither failed it nor was lost", id, cur)
	}
}

// endedByCurrentAttempt: a job that retries and ends by a worker's result
// ends by its current attempt's result, never an earlier attempt's.
func (s *sim) endedByCurrentAttempt(id string, r *simRec) {
	switch jobstate.Reason(r.fields["reason"]) {
	case jobstate.ReasonCompleted, jobstate.ReasonWorkerFailed, jobstate.ReasonWorkerFailedFatal,
		jobstate.ReasonWorkerCancelled, jobstate.ReasonWorkerTimeout, jobstate.ReasonOutputRedacted:
	default:
		return
	}
	if r.fields["result_of"] != "" {
		return // an earlier dispatch of the same attempt (its worker was lost)
	}
	cur, _ := strconv.Atoi(r.fields[jobstate.FieldTry])
	if _, ok := s.attemptSent[jobstate.AttemptID(id, max(cur, 1))]; !ok {
		s.fail("%s: ended %s by a result, but attempt %d sent none", id, r.state, max(cur, 1))
	}
}
