package lifecycle

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The simulator drives the decision core through the shell's contract with
// a model of everything around it — Redis (fenced scripts, locks with TTLs,
// leases, due and parked sets), JetStream deliveries (acks, naks,
// redelivery), the router (picks, a capacity queue, placements, evictions),
// the input policy (with outages), workers (direct and pool subjects,
// stock workers that send no progress, deduping workers) and nodes (death,
// restart, pauses) — in random interleavings, seeded and reproducible, and
// checks the invariants after every step. A failure prints the seed;
// TROUPE_SIM_SEED=<seed> replays it, TROUPE_SIM_SEEDS and TROUPE_SIM_STEPS
// make a longer soak (README, "The job's decision core").

const (
	simLockTTL   = 30 * time.Second
	simAckWait   = 30 * time.Second
	simRescue    = 60 * time.Second
	simRunning   = 10 * time.Minute
	simDispatch  = 5 * time.Minute
	simTick      = time.Second
	simMaxSteps  = 6000 // per seed, before the calm phase
	simCalmSteps = 60000
	// simRetryAttempts: jobs labelled retry run at most this many times.
	simRetryAttempts = 3
	// simRetryParkMin: a retry wait this long or longer parks. Jobs
	// labelled retry=long back off 10–20 s before attempt 2 (some park,
	// some do not) and 20–40 s before attempt 3 (all park); retry=yes
	// backs off 100–400 ms and never parks.
	simRetryParkMin = 15 * time.Second
)

type sim struct {
	t      testing.TB
	seed   uint64
	rng    *rand.Rand
	now    time.Time
	cfg    Config
	recs   map[string]*simRec
	idem   map[string]string
	tenant map[string]bool // job ids holding a tenant slot
	// tenantAt: when each holder took its tenant slot (unix ms), the
	// slot's score, which the repair reads (sim_tenant_test.go).
	tenantAt map[string]int64
	tenants  bool // more jobs of the limited tenant (newTenantSim)
	// sentHop: the DISPATCHED write (dispatchHops' count) whose request
	// was last sent to a worker (a publish or a resend), per job.
	sentHop map[string]int
	// admittedIn: the loss count when each job last took a tenant slot (kept across a
	// loss); slotLost: jobs dispatched without one, Redis having lost it
	// since (checkTenants leaves them out until dispatched again).
	admittedIn map[string]int
	slotLost   map[string]bool
	// rewrittenIn: the loss count when an actor of the job last wrote its record back
	// (state_lost): an actor that did so after a loss knew of it.
	rewrittenIn map[string]int
	losses      int // Redis data losses so far
	dlq         int
	nodes       []*simNode
	workers     []*simWorker
	net         []*simMsg
	seq         int
	jobs        []string
	subs        map[string][]*simDelivery

	kernelDownUntil time.Time
	dataLostAt      time.Time
	faults          bool
	steps           int
	redelivered     int
	graceWaits      int             // waits within the capacity grace begun
	holdsEnded      int             // of those, admission holds that ended (Admitted)
	probes          map[string]bool // jobs that looked their record up while waiting unwritten
	deliveries      []*simDelivery
	resent          int // results a deduping worker sent again

	// What the invariants compare against.
	dispatchHops   map[string]int
	published      map[string]int
	lostSent       map[string]map[string]bool
	pubFailed      map[string]bool
	denies         map[string]bool
	terminal       map[string]jobstate.State
	failures       []string
	trace          []string
	outcomes       map[string]int // final state:reason → jobs
	keys           *simKeyModel   // concurrency keys, when on (sim_keys_test.go)
	keyWaits       int
	keyVictims     int
	keyStale       int       // dispatches withheld on a stale key slot
	keyRepaired    int       // key slots the repair freed
	tenantStale    int       // dispatches withheld on a stale tenant slot
	tenantRepaired int       // tenant slots the repair freed
	tenantRepairAt time.Time // the next repair of tenant slots
	// withheld: jobs whose DISPATCHED record the core did not publish (its
	// key slot granted too long before), until a publish or its undo.
	withheld map[string]bool
	// lostActive: jobs whose records Redis lost and their actors wrote
	// again (state_lost) as with a worker, until dispatched again
	// (checkKeys).
	lostActive map[string]bool
	// Retries: the attempt ids a worker sent a terminal result for (and
	// which status), the retries written, the final outcomes relayed to
	// clients per job.
	attemptSent map[string]capv1.JobStatus
	retries     int
	retryParks  int // retry waits that released their lock to park
	// Waits left alone (Alone): lostAlone, the jobs a node's sweep woke as
	// lost (no record after a loss), true until they end visibly (a
	// terminal record, a state_lost tell); toldLost, the state_lost tells per
	// job; aloneAfterEnd, lost wakes of jobs that had ended (a stale
	// entry: woken elsewhere, ended, then lost).
	lostAlone     map[string]bool
	lostBy        map[string]*simNode // the node whose sweep woke it
	aloneDied     int                 // woken by a node that died before the job ended
	toldLost      map[string]int
	everEnded     map[string]bool
	aloneIndexed  int
	aloneAfterEnd int
	relays        map[*simRec]int
	rate          simRate // the rate limiter's model (sim_rate_test.go)
}

func newSim(t testing.TB, seed uint64) *sim {
	s := &sim{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), recs: map[string]*simRec{}, idem: map[string]string{},
		tenant: map[string]bool{}, tenantAt: map[string]int64{}, sentHop: map[string]int{}, admittedIn: map[string]int{}, slotLost: map[string]bool{}, rewrittenIn: map[string]int{}, subs: map[string][]*simDelivery{}, dispatchHops: map[string]int{},
		published: map[string]int{}, lostSent: map[string]map[string]bool{}, pubFailed: map[string]bool{},
		lostAlone: map[string]bool{}, lostBy: map[string]*simNode{}, toldLost: map[string]int{}, everEnded: map[string]bool{},
		denies: map[string]bool{}, terminal: map[string]jobstate.State{}, faults: true, outcomes: map[string]int{},
		attemptSent: map[string]capv1.JobStatus{}, relays: map[*simRec]int{}, withheld: map[string]bool{},
		lostActive: map[string]bool{}}
	s.cfg = Config{NodeID: "", IdemKey: func(tenant, key string) string { return tenant + "/" + key },
		TenantKey: func(tenant string) string { return "tenant:" + tenant }, SubmitSubject: "sys.job.submit",
		ResultSubject: "sys.job.result", Dispatch: simDispatch,
		RunningFor: func(string) time.Duration { return simRunning },
		TenantLimit: func(tenant string) int {
			if tenant == "limited" {
				return 2
			}
			return 0
		},
		Backoff: func(n int) time.Duration {
			return min(time.Second<<min(n, 5), 30*time.Second) + time.Duration(s.rng.IntN(500))*time.Millisecond
		},
		MaxSchedulingAttempts: 8, PermanentGrace: 10 * time.Second, ParkAfter: 10 * time.Second,
		RateParkAfter: simRateParkAfter, RetryParkMin: simRetryParkMin,
		ResendAfter: 5 * time.Second, CapacityGrace: 25 * time.Second, AdmissionHold: 2 * time.Second, UnknownHold: 20 * time.Second, PolicyWaiters: false, Forward: false,
		RateLimit: simRateLimit, WorkerLostGrace: time.Minute, Direct: func(subject, worker string) bool { return subject == "worker."+worker+".jobs" },
		Retry: func(req *capv1.JobRequest) jobstate.RetryPolicy {
			switch req.GetLabels()["retry"] {
			case "":
				return jobstate.RetryPolicy{}
			case "long":
				return jobstate.RetryPolicy{MaxAttempts: simRetryAttempts, BackoffMin: 20 * time.Second, BackoffMax: 40 * time.Second}
			}
			return jobstate.RetryPolicy{MaxAttempts: simRetryAttempts, BackoffMin: 200 * time.Millisecond, BackoffMax: 2 * time.Second}
		}}
	s.rateInit()
	for i := 0; i < 3; i++ {
		s.nodes = append(s.nodes, s.newNode(fmt.Sprintf("n%d", i)))
	}
	for i := 0; i < 4; i++ {
		s.workers = append(s.workers, &simWorker{id: fmt.Sprintf("w%d", i), alive: true, stock: i == 3,
			dedupe: i == 1 || i == 2, pool: i >= 2, running: map[string]bool{}, done: map[string]capv1.JobStatus{}})
	}
	for _, n := range s.nodes {
		s.tick(n)
	}
	s.dueTick()
	return s
}

func (s *sim) newNode(id string) *simNode {
	return &simNode{id: id, alive: true, live: map[string]*simActor{}, parked: map[string]bool{},
		held: map[string]string{}, queue: map[string]uint64{}, picks: map[string]string{}, alone: map[string]simAlone{}}
}

func (s *sim) fail(format string, args ...any) {
	s.failures = append(s.failures, fmt.Sprintf("t+%s step %d: ", s.now.Sub(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), s.steps)+
		fmt.Sprintf(format, args...))
}

func (s *sim) logf(format string, args ...any) {
	if simWatch != "" && os.Getenv("TROUPE_SIM_PRINT") != "" {
		line := fmt.Sprintf(format, args...)
		if strings.Contains(line, simWatch) || strings.HasPrefix(line, "   ") || strings.HasPrefix(line, "fault") {
			fmt.Printf("%d %s %s\n", s.steps, s.now.Format("15:04:05.000"), line)
		}
	}
	if len(s.trace) >= 200 {
		s.trace = s.trace[1:]
	}
	s.trace = append(s.trace, fmt.Sprintf("%d %s ", s.steps, s.now.Format("15:04:05.000"))+fmt.Sprintf(format, args...))
}

func (s *sim) send(m *simMsg) {
	s.seq++
	m.seq = s.seq
	s.net = append(s.net, m)
}

func (s *sim) after(d time.Duration, fn func()) {
	s.send(&simMsg{at: s.now.Add(d), fn: fn})
}

func (s *sim) latency() time.Duration { return time.Duration(1+s.rng.IntN(20)) * time.Millisecond }

func (s *sim) aliveNodes() []*simNode {
	var out []*simNode
	for _, n := range s.nodes {
		if n.alive {
			out = append(out, n)
		}
	}
	return out
}

// lockHeld reports whether rec's lock is held by someone now.
func (s *sim) lockHeld(r *simRec) bool {
	if r.lock == "" {
		return false
	}
	if r.parkedBy != "" {
		return s.node(r.parkedBy).alive
	}
	return s.now.Before(r.lockExp)
}

func (s *sim) node(id string) *simNode {
	for _, n := range s.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// submit publishes a new job (sometimes with an idempotency key shared
// with an earlier one, sometimes twice).
func (s *sim) submit() {
	id := fmt.Sprintf("job-%d", len(s.jobs))
	s.jobs = append(s.jobs, id)
	req := &capv1.JobRequest{JobId: id, Topic: "job.sim", Labels: map[string]string{}}
	switch h := hash(id) % 20; {
	case h == 0:
		req.Labels["policy"] = "deny"
	case h == 1:
		req.Labels["policy"] = "approve"
	case h == 2:
		req.Labels["policy"] = "throttle"
	case h == 3:
		req.Meta = &capv1.JobMetadata{IdempotencyKey: "k" + strconv.Itoa(len(s.jobs)%3)}
	case h == 4:
		req.TenantId = "limited"
	case h == 5:
		req.Budget = &capv1.Budget{DeadlineMs: 90_000}
	case h >= 6 && h <= 9 && s.keys != nil:
		keyLabel(req, h)
	case h == 10:
		req.Labels["retry"] = "yes"
	case h == 11:
		req.Labels["retry"] = "long"
	case h == 12:
		req.Labels["retry"] = "yes"
		req.Budget = &capv1.Budget{DeadlineMs: 30_000}
	case h >= 13 && h <= 17 && s.tenants:
		req.TenantId = "limited"
	}
	rateLabel(req)
	s.deliverNew(id, &Submit{Req: req, TraceID: "tr-" + id})
	if s.rng.IntN(10) == 0 {
		s.deliverNew(id, &Submit{Req: req, TraceID: "tr-" + id}) // a duplicate publish
	}
}

// deliverNew puts a JetStream message for job on the wire.
func (s *sim) deliverNew(job string, ev any) {
	d := &simDelivery{s: s, ev: ev, job: job}
	s.deliveries = append(s.deliveries, d)
	switch e := ev.(type) {
	case *Submit:
		e.Delivery = d
		s.subs[job] = append(s.subs[job], d)
	case *Result:
		e.Delivery, e.Published = d, s.now
	case *Cancel:
		e.Delivery, e.Published = d, s.now
	}
	s.send(&simMsg{anyNode: true, job: job, ev: ev, spawn: true, at: s.now.Add(s.latency())})
}

func hash(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

// deliver hands ev to job's actor on n, spawning one when spawn allows it
// (or the job is parked there and ev is its worker's progress or loss).
func (s *sim) deliver(n *simNode, job string, ev any, spawn bool) {
	a := n.live[job]
	if a == nil {
		_, wl := ev.(*WorkerLost)
		_, pr := ev.(*Progress)
		// A rate limiter's answer for a parked ask spawns the job's next
		// actor (the shard's Redeliver of *Tokens).
		_, tk := ev.(*Tokens)
		if !spawn && !tk && !(n.parked[job] && (wl || pr)) {
			return
		}
		delete(n.parked, job)
		a = &simActor{j: New(s.nodeCfg(n), job, s.rng.Uint64())}
		n.live[job] = a
	}
	if d, ok := deliveryOf(ev); ok && d != nil {
		d.holder, d.heldAt = n, s.now
	}
	_, wl := ev.(*WorkerLost)
	_, pr := ev.(*Progress)
	passOn := a.j.res == Parked && a.j.State == jobstate.StateDispatched && (wl || pr)
	redelivered := s.redelivered
	s.step(n, a, ev)
	if passOn && s.redelivered == redelivered {
		s.fail("%s: %T reached the actor that had just parked the job, and was dropped", job, ev)
	}
}

func deliveryOf(ev any) (*simDelivery, bool) {
	switch e := ev.(type) {
	case *Submit:
		d, ok := e.Delivery.(*simDelivery)
		return d, ok
	case *Result:
		d, ok := e.Delivery.(*simDelivery)
		return d, ok
	case *Cancel:
		d, ok := e.Delivery.(*simDelivery)
		return d, ok
	}
	return nil, false
}

func (s *sim) nodeCfg(n *simNode) *Config {
	c := s.cfg
	c.NodeID = n.id
	return &c
}

// step feeds one event to an actor and carries out its effects.
func (s *sim) step(n *simNode, a *simActor, ev any) {
	for ev != nil {
		in := (*simInputs)(s)
		wd, isWrite := ev.(*WriteDone)
		fenced := isWrite && wd.Res.Err == nil && wd.Res.Step == StepFenced
		if p := a.j.pending; fenced && p != nil && p.t != nil && wd.Res.Before == "" && wd.Res.LastOp == p.t.Op {
			fenced = false // its own earlier try applied: not a refusal
		}
		s.logf("%s %s <- %T %s", n.id, a.j.ID, ev, describe(ev))
		fx := slices.Clone(a.j.Step(ev, in))
		if simWatch != "" && a.j.ID == simWatch {
			var names []string
			for _, e := range fx {
				names = append(names, fmt.Sprintf("%T%v", e, e))
			}
			s.logf("   %s fx: %s", n.id, strings.Join(names, " "))
		}
		ev = nil
		for _, e := range fx {
			if fenced {
				switch e.(type) {
				case *PublishRequest, TellClient, PublishDLQ, CancelWorker, ScanContent, *Ack:
					s.fail("%s: effect %T after a fenced write", a.j.ID, e)
				}
			}
			if next := s.do(n, a, e); next != nil {
				ev = next
			}
		}
		// As the shell: the step's pointer effects' storage goes back, to
		// be reused by this and other jobs' next steps.
		a.j.Consumed()
	}
}

// simInputs is the core's Inputs in the simulation: the simulated clock,
// the seeded generator.
type simInputs sim

func (i *simInputs) Now() time.Time          { return i.now }
func (i *simInputs) OpID() uint64            { return i.rng.Uint64() }
func (i *simInputs) GraceRoom() bool         { return true }
func (i *simInputs) Connected() bool         { return true }
func (i *simInputs) Count(Metric, string)    {}
func (i *simInputs) Observe(Metric, float64) {}
func (i *simInputs) DataLost() bool {
	return !i.dataLostAt.IsZero() && i.now.Sub(i.dataLostAt) < simDataLostFor
}

// simWatch (TROUPE_SIM_JOB) logs every effect of one job's steps.
var simWatch = os.Getenv("TROUPE_SIM_JOB")

func describe(ev any) string {
	switch e := ev.(type) {
	case *WriteDone:
		r := e.Res
		if r.Err != nil {
			return "err"
		}
		return fmt.Sprintf("%s%s %s", r.Status, r.Step, r.State)
	case *PickReply:
		return fmt.Sprintf("w=%s q=%v %s", e.WorkerID, e.Queued, e.Reason)
	case *Result:
		return fmt.Sprintf("%s %s w=%s", e.Res.GetJobId(), e.Res.GetStatus(), e.Res.GetWorkerId())
	case *WorkerLost:
		return "w=" + e.WorkerID
	}
	return ""
}

// do carries out one effect as the shell would, against the models.
func (s *sim) do(n *simNode, a *simActor, e Effect) any {
	j := a.j
	switch e := e.(type) {
	case *Write:
		op := e.Op
		if op.Kind == OpActivate && !op.Create && a.j.res == Unwritten {
			if s.probes == nil {
				s.probes = map[string]bool{}
			}
			s.probes[j.ID] = true
		}
		if op.Kind == OpRelease && !e.Retry && j.State == jobstate.StateScheduled && j.LastReason == jobstate.ReasonRetryWait &&
			j.retryAt.Sub(s.now) < simRetryParkMin {
			s.fail("%s: a retry wait with %s left parks (the threshold is %s)", j.ID, j.retryAt.Sub(s.now), simRetryParkMin)
		}
		if e.Epoch == 0 {
			s.after(s.latency(), func() { s.apply(n, op) })
			return nil
		}
		ep := e.Epoch
		s.after(s.latency(), func() {
			r := s.writeFault(n, op)
			s.send(&simMsg{node: n, actor: a, job: j.ID, ev: &WriteDone{Epoch: ep, Res: *r}, at: s.now.Add(s.latency()),
				rec: s.recs[op.JobID]})
		})
	case RetryWrite:
		s.send(&simMsg{node: n, actor: a, job: j.ID, ev: &RetryNow{Epoch: e.Epoch}, at: s.now.Add(e.After)})
	case *AskRouter:
		s.pick(n, a, e.Req.(*PickRequest))
	case *ToRouter:
		switch m := e.Msg.(type) {
		case *Withdraw:
			if n.queue[m.JobID] == m.Ticket {
				delete(n.queue, m.JobID)
			}
		case *Released:
			if m.Done && n.picks[m.JobID] == m.WorkerID {
				delete(n.picks, m.JobID)
			}
		case *Occupied:
			n.picks[m.JobID] = m.WorkerID
		case *Took:
		}
	case *AskPolicy:
		ep, req := e.Epoch, e.Req
		s.send(&simMsg{node: n, actor: a, job: j.ID, at: s.now.Add(s.latency()), ev: s.policy(j.ID, req, ep)})
	case TakeTokens:
		return s.takeTokens(n, a, e)
	case LeaveTokens:
		s.leaveTokens(n, a, e)
	case ParkTokens:
		s.parkTokens(n, a, e)
	case *PublishRequest:
		delete(s.withheld, j.ID)
		s.sentHop[j.ID] = s.dispatchHops[j.ID]
		if !e.Resend {
			s.checkRateDispatch(a)
			s.published[j.ID]++
			if s.published[j.ID] > s.dispatchHops[j.ID] {
				s.fail("%s: %d dispatches published for %d DISPATCHED writes", j.ID, s.published[j.ID], s.dispatchHops[j.ID])
			}
			if s.faults && s.rng.IntN(50) == 0 {
				s.pubFailed[j.ID] = true
				return &PublishFailed{Err: errors.New("nats: connection closed")}
			}
		}
		s.reach(j.WorkerJobID(), j.Worker, e.Subject)
	case CancelWorker:
		for _, w := range s.workers {
			if !w.stock && w.running[j.WorkerJobID()] {
				delete(w.running, j.WorkerJobID())
			}
		}
	case TellClient:
		if e.Code == jobstate.ReasonStateLost && e.Once {
			s.toldLost[j.ID]++
			if s.lostAlone[j.ID] {
				s.lostAlone[j.ID] = false
			}
		}
		if e.Res != nil {
			// At most once per record (a record Redis lost is written
			// again, and its job may end again), counted against the
			// record the actor's write met: a reply delayed past a loss
			// and a new submit's record tells of the record it ended, not
			// of the new one (seed 541).
			r := s.recs[j.ID]
			if a.rec != nil {
				r = a.rec
			}
			if r != nil {
				s.relays[r]++
			}
			if r != nil && (!r.state.Terminal() || s.relays[r] > 1) || !j.Retries() {
				s.fail("%s: a worker's result relayed to the client (%d for its record), record %v, retries %v", j.ID, s.relays[r], r, j.Retries())
			}
		}
	case Count:
		if e.M == MRetried {
			s.retries++
		}
	case *Arm:
		a.timerAt, a.timerEpoch = e.At, e.Epoch
	case Disarm:
		a.timerAt = time.Time{}
	case *Ack:
		_ = e.D.Ack()
	case Nak:
		_ = e.D.NakWithDelay(e.Delay)
	case Touch:
		_ = e.D.InProgress()
	case *Hold:
		n.held[j.ID] = e.LockValue
		delete(n.alone, j.ID)
		// Another node's entry for the job is stale from now: its verify
		// (a read of the record, each tick) drops it a tick later if the
		// job is still out of its wait then.
		held, id := s.now, j.ID
		s.after(simVerifyTick, func() {
			for _, m := range s.nodes {
				if e, ok := m.alone[id]; ok && e.at.Before(held) && s.recs[id] != nil && !s.recs[id].alone() {
					delete(m.alone, id)
				}
			}
		})
	case Alone:
		if j.LockValue != "" || (e.Kind == WaitRetry) != !e.Due.IsZero() {
			s.fail("%s: alone (%d, due %v) with its lock %q", j.ID, e.Kind, e.Due, j.LockValue)
		}
		n.alone[j.ID] = simAlone{due: e.Due, at: s.now}
		s.aloneIndexed++
	case *Forget:
		if n.held[j.ID] == e.LockValue {
			delete(n.held, j.ID)
		}
	case Finish:
		if a.grace != 0 {
			s.fail("%s: finished while waiting within the grace", j.ID)
		}
		// The shard handles the Finished message a moment later; events
		// for the job meanwhile still reach the finished actor.
		fin := e
		s.send(&simMsg{node: n, at: s.now.Add(s.latency()), job: j.ID, fn: func() {
			if n.live[j.ID] != a {
				return
			}
			delete(n.live, j.ID)
			if s.keys != nil {
				s.keys.dropJob(n, j.ID) // the actor's stop leaves the node's key waiters
			}
			if fin.Parked {
				n.parked[j.ID] = true
			}
			for _, m := range fin.Redeliver {
				s.send(&simMsg{node: n, job: j.ID, ev: m, at: s.now.Add(time.Millisecond)})
			}
		}})
	case Redeliver:
		s.redelivered++
		for _, m := range e.Msgs {
			s.send(&simMsg{node: n, job: j.ID, ev: m, at: s.now.Add(time.Millisecond)})
		}
	case *Grace:
		a.grace += e.Delta
		if a.grace < 0 || a.grace > 1 {
			s.fail("%s: %d waits within the grace at once", j.ID, a.grace)
		}
		if e.Delta > 0 && len(e.Deliveries) == 0 {
			s.fail("%s: a wait within the grace with no submit to keep", j.ID)
		}
		a.admitted = false
		if e.Delta > 0 {
			s.graceWaits++
		}
	case Admitted:
		s.holdsEnded++
		if a.grace != 1 || a.admitted {
			s.fail("%s: Admitted outside a wait within the grace, or twice in one", j.ID)
		}
		a.admitted = true
	case Log:
		if e.Msg == MsgIllegalMove {
			s.fail("%s: %s %v", j.ID, e.Msg, e.Args)
		}
		if e.Msg == msgKeySlotStale {
			s.withheld[j.ID] = true
			s.keyStale++
		}
		if e.Msg == msgTenantSlotStale {
			s.withheld[j.ID] = true
			s.tenantStale++
		}
	case AskKeySlot, WaitKey, ReleaseKey, CancelJob:
		s.keyEffect(n, a, e)
	case PublishDLQ, Observe, Terminal, WaitPolicy, WakePolicyWaiters, ScanContent, AskOutput, Forward:
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// next takes the message to handle: a random one of those due now, or
// (time passing) the earliest timer or message.
func (s *sim) next() bool {
	var ready []int
	for i, m := range s.net {
		if !m.at.After(s.now) {
			ready = append(ready, i)
		}
	}
	if len(ready) > 0 {
		i := ready[s.rng.IntN(len(ready))]
		m := s.net[i]
		s.net[i] = s.net[len(s.net)-1]
		s.net = s.net[:len(s.net)-1]
		s.handle(m)
		return true
	}
	// Nothing due: time passes to the next message or timer.
	var nextMsg, nextTimer time.Time
	for _, m := range s.net {
		if nextMsg.IsZero() || m.at.Before(nextMsg) {
			nextMsg = m.at
		}
	}
	// The earliest timer; a tie goes to the first node, then the smallest
	// job id (found without sorting: this runs at every pause).
	var fire *simActor
	var fireNode *simNode
	fireID := ""
	for _, n := range s.nodes {
		if !n.alive {
			continue
		}
		for id, a := range n.live {
			at := a.timerAt
			if at.IsZero() {
				continue
			}
			if at.Before(n.pausedUntil) {
				at = n.pausedUntil
			}
			if nextTimer.IsZero() || at.Before(nextTimer) || at.Equal(nextTimer) && fireNode == n && id < fireID {
				nextTimer, fire, fireNode, fireID = at, a, n, id
			}
		}
	}
	switch {
	case fire != nil && (nextMsg.IsZero() || !nextTimer.After(nextMsg)):
		if nextTimer.After(s.now) {
			s.now = nextTimer
		}
		s.steps++
		ep := fire.timerEpoch
		fire.timerAt = time.Time{}
		s.step(fireNode, fire, &Timer{Epoch: ep})
		return true
	case !nextMsg.IsZero():
		s.now = nextMsg
		return true
	}
	return false
}

// handle runs one message: a model action, or an event for a job's actor.
func (s *sim) handle(m *simMsg) {
	s.steps++
	if m.fn != nil {
		m.fn()
		return
	}
	n := m.node
	if m.anyNode {
		alive := s.aliveNodes()
		if len(alive) == 0 {
			m.at = s.now.Add(time.Second)
			s.send(m)
			return
		}
		n = alive[s.rng.IntN(len(alive))]
	}
	if !n.alive {
		if d, ok := deliveryOf(m.ev); ok && !d.done {
			_ = d.NakWithDelay(simAckWait) // JetStream offers it again after the ack wait
		}
		return
	}
	if s.now.Before(n.pausedUntil) {
		m.at = n.pausedUntil
		s.send(m)
		return
	}
	if m.actor != nil {
		if n.live[m.job] != m.actor {
			if _, tk := m.ev.(*Tokens); tk && m.actor.j.res == Parked {
				// Sent before the actor parked the job: its mailbox still
				// held it when the shard stopped it (a poison pill comes
				// after what is queued).
				s.step(n, m.actor, m.ev)
			}
			return // the actor that asked is gone: its answer is dropped
		}
		if _, ok := m.ev.(*WriteDone); ok {
			m.actor.rec = m.rec
		}
		s.step(n, m.actor, m.ev)
		return
	}
	s.deliver(n, m.job, m.ev, m.spawn)
}

// redeliverStale offers again the deliveries a node has held un-acked for
// longer than the ack wait, as JetStream does.
func (s *sim) redeliverStale() {
	for _, d := range s.deliveries {
		if !d.done && d.holder != nil && s.now.Sub(d.heldAt) > simAckWait {
			d.holder = nil
			s.send(&simMsg{anyNode: true, job: d.job, ev: d.ev, spawn: true, at: s.now})
		}
	}
}

// check verifies the invariants that hold at every step.
func (s *sim) check() {
	if s.keys != nil {
		s.checkKeys()
	}
	s.tenantRepair()
	s.checkTenants()
	for _, id := range s.jobs {
		r := s.recs[id]
		if r == nil {
			// Not created yet: its submit must still be on its way.
			owed := false
			for _, d := range s.subs[id] {
				if !d.done {
					owed = true
				}
			}
			if !owed && !s.dataLostAt.IsZero() {
				owed = true // a lost record whose submit was acked: lost with Redis
			}
			if !owed && s.idemDuplicate(id) {
				owed = true
			}
			if !owed {
				s.fail("%s: no record and no submit outstanding", id)
			}
			continue
		}
		if r.state.Terminal() {
			continue
		}
		if !s.hasWakeSource(id, r) {
			s.fail("%s: %s (%s) has no wake source", id, r.state, r.fields["reason"])
		}
	}
}

func (s *sim) idemDuplicate(id string) bool {
	for _, d := range s.subs[id] {
		if sub, ok := d.ev.(*Submit); ok && sub.Req.GetMeta().GetIdempotencyKey() != "" {
			return true
		}
	}
	return false
}

// hasWakeSource: a live actor with a step outstanding, a timer, a queue
// place or an event on its way; else a due entry, a lapsing lease, a parked
// entry, an approval wait, or an event on its way that spawns an actor.
func (s *sim) hasWakeSource(id string, r *simRec) bool {
	for _, n := range s.nodes {
		if !n.alive {
			continue
		}
		if a := n.live[id]; a != nil && (a.j.live() || a.j.busy) {
			if a.j.busy || !a.timerAt.IsZero() || n.queue[id] != 0 && a.j.queued {
				return true
			}
			for _, m := range s.net {
				if m.job == id && (m.node == n || m.anyNode) {
					return true
				}
			}
			if a.j.State == jobstate.StateApprovalRequired && a.j.res.Gone() {
				return true
			}
			return false
		}
	}
	switch {
	case r.due > 0, r.parkedBy != "", r.lease, r.state == jobstate.StateApprovalRequired:
		return true
	}
	for _, m := range s.net {
		if m.job == id && (m.spawn || m.fn != nil) {
			return true
		}
	}
	return false
}

// run plays one seed: faults and submits for steps, then calm (no new
// faults, every node and worker back, approvals decided) until every job
// is terminal.
func (s *sim) run(steps int) {
	for i := 0; i < 6; i++ {
		s.submit()
	}
	for s.steps < steps && len(s.failures) == 0 {
		switch r := s.rng.IntN(100); {
		case r < 2 && len(s.jobs) < 40:
			s.submit()
		case r < 4 && s.faults:
			s.fault()
		}
		if !s.next() {
			break
		}
		if s.steps%50 == 0 {
			s.redeliverStale()
		}
		s.check()
	}
	// Calm: the system must finish every job.
	s.faults = false
	s.kernelDownUntil = time.Time{}
	for _, n := range s.nodes {
		n.pausedUntil = time.Time{}
	}
	for _, w := range s.workers {
		w.alive = true
	}
	end := s.steps + simCalmSteps
	for s.steps < end && len(s.failures) == 0 {
		s.decideApprovals(true)
		if !s.next() {
			break
		}
		if s.steps%50 == 0 {
			s.redeliverStale()
		}
		s.check()
		// A wait woken lost must have ended too: it has no record, so
		// allTerminal counts it as gone with the data (seed 7900786: the
		// calm stopped one step after the sweep woke it).
		if s.steps%500 == 0 && s.allTerminal() && s.allAnswered() && !s.lostAlonePending() {
			break
		}
	}
	if len(s.failures) == 0 {
		// Every message was answered in the end: none is handed back for
		// ever (a cancel the job never applies, say).
		for _, d := range s.deliveries {
			if !d.done && s.recs[d.job] != nil {
				held := "on its way again"
				if d.holder != nil {
					held = "held by " + d.holder.id
				}
				s.fail("%s: a %T was never acked (%s)", d.job, d.ev, held)
				break
			}
		}
	}
	if len(s.failures) == 0 {
		s.checkRateQueues()
	}
	if len(s.failures) == 0 {
		s.checkLostAlone()
	}
	if len(s.failures) == 0 && !s.allTerminal() {
		for _, id := range s.jobs {
			if r := s.recs[id]; r != nil && !r.state.Terminal() {
				s.fail("%s: still %s (%s) after the calm", id, r.state, r.fields["reason"])
			}
		}
	}
}

func (s *sim) allAnswered() bool {
	for _, d := range s.deliveries {
		if !d.done && s.recs[d.job] != nil {
			return false
		}
	}
	return true
}

func (s *sim) allTerminal() bool {
	for _, id := range s.jobs {
		r := s.recs[id]
		if r == nil {
			if s.dataLostAt.IsZero() && !s.idemDuplicate(id) {
				return false
			}
			continue
		}
		if !r.state.Terminal() {
			return false
		}
	}
	return true
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestSimJobLifecycle runs the simulator over many seeds (≥ 1,000,000
// steps in all by default); TROUPE_SIM_SEED replays one.
func TestSimJobLifecycle(t *testing.T) {
	t.Parallel() // beside the conformance test, which mostly waits on Redis
	seeds, steps := envInt("TROUPE_SIM_SEEDS", 170), envInt("TROUPE_SIM_STEPS", simMaxSteps)
	first := uint64(envInt("TROUPE_SIM_FIRST", 1))
	if v := os.Getenv("TROUPE_SIM_SEED"); v != "" {
		seed, _ := strconv.ParseUint(v, 10, 64)
		first, seeds = seed, 1
	}
	total, resent, graceWaits, holdsEnded, probes, retries, rateParks, retryParks, rateRetries := 0, 0, 0, 0, 0, 0, 0, 0, 0
	aloneIndexed, lostAlone, aloneAfterEnd := 0, 0, 0
	tenantStale, tenantRepaired := 0, 0
	outcomes := map[string]int{}
	for seed := first; seed < first+uint64(seeds); seed++ {
		s := newSim(t, seed)
		s.run(steps)
		total += s.steps
		resent += s.resent
		graceWaits += s.graceWaits
		holdsEnded += s.holdsEnded
		probes += len(s.probes)
		retries += s.retries
		rateParks += s.rate.parks
		retryParks += s.retryParks
		rateRetries += s.rate.retried
		aloneIndexed += s.aloneIndexed
		lostAlone += len(s.lostAlone)
		aloneAfterEnd += s.aloneAfterEnd
		tenantStale += s.tenantStale
		tenantRepaired += s.tenantRepaired
		for k, v := range s.outcomes {
			outcomes[k] += v
		}
		if len(s.failures) > 0 {
			t.Errorf("seed %d (replay: TROUPE_SIM_SEED=%d go test -run TestSimJobLifecycle ./internal/lifecycle/):\n  %s\nlast events:\n  %s",
				seed, seed, strings.Join(s.failures[:min(len(s.failures), 5)], "\n  "),
				strings.Join(s.trace[max(0, len(s.trace)-envInt("TROUPE_SIM_TRACE", 40)):], "\n  "))
			return
		}
	}
	keys := sortedKeys(outcomes)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, outcomes[k]))
	}
	t.Logf("%d seeds, %d steps; outcomes: %s; results sent again: %d; waits within the capacity grace %d, admission holds ended %d, jobs that looked their record up while waiting %d; attempts retried %d; tenant slots freed by the repair %d, dispatches withheld on a stale tenant slot %d; waits for tokens parked %d; retry waits parked %d; rate-limited retries dispatched %d",
		seeds, total, strings.Join(parts, ", "), resent, graceWaits, holdsEnded, probes, retries, tenantRepaired, tenantStale, rateParks, retryParks, rateRetries)
	t.Logf("waits left alone indexed %d; woken as lost after a loss %d (of them after the job had ended: %d)", aloneIndexed, lostAlone, aloneAfterEnd)
	if seeds >= 50 && retryParks == 0 {
		t.Errorf("the simulation never parked a retry wait")
	}
	if seeds >= 50 && lostAlone == 0 {
		t.Errorf("the simulation never woke a wait left alone whose record Redis lost")
	}
	if seeds >= 50 && rateRetries == 0 {
		t.Errorf("the simulation never dispatched a retry of a rate-limited job")
	}
	if seeds >= 50 && rateParks == 0 {
		t.Errorf("the simulation never parked a job waiting for rate limit tokens")
	}
	if seeds >= 50 && retries == 0 {
		t.Errorf("the simulation never retried a failed attempt")
	}
	if seeds >= 50 && (graceWaits == 0 || holdsEnded == 0 || probes == 0) {
		t.Errorf("the simulation never had a job wait within its capacity grace (%d), outlast its admission hold (%d) or look its record up while waiting (%d)",
			graceWaits, holdsEnded, probes)
	}
}
