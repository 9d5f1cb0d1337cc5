package lifecycle

import (
	"strconv"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// Rate limits: a job that declares a token bucket and units waits for its
// tokens before it asks the router for a worker, so a job holding a
// worker's slot never waits on a bucket.
//
// The rules:
//   - The job asks the node's limiter for its units (TakeTokens) and waits
//     for the answer as a step (busy: a cancel is handled after it). The
//     limiter answers granted at once when its credit covers the job and
//     nobody is queued before it, or queues the job and answers after its
//     first call to Redis: granted, or not yet.
//   - Not yet: the wait is written — SCHEDULED rate_limited with the
//     bucket and units (a fresh job is created so; its submit is acked) —
//     and the job's timer is armed for its deadline, or RateRecheck,
//     whichever is first. Nothing more is written while it waits; the
//     limiter's grant (Tokens{Granted}) ends the wait and the job asks the
//     router. A job whose wait is cut short by a node's crash is adopted
//     (SCHEDULED, its lock's lease lapsed) and asks for its tokens again.
//   - On a node that parks (Config.RateParkAfter > 0: the node's ParkAfter)
//     a wait that has lasted RateParkAfter parks (ParkTokens, then the park write; a shorter one
//     costs less live than a park and a wake): the actor stops, the lock
//     is held through the node lease (nothing is renewed), the job is due
//     in the node's parked set at its deadline, and the limiter keeps its
//     place under epoch 0. The limiter's answer — the grant, or never — is
//     handed to the job's next actor through the node (Redeliver), which
//     activates the job with the grant in hand (the units are given back
//     if the job is no longer there to use them). An actor that activates a
//     parked wait for another reason (a cancel, its deadline) knows the
//     ask as epoch 0: it asks again (the limiter keeps the place) or
//     leaves it. A grant that reaches an actor already queued again for
//     the same units ends its wait, and its own ask is withdrawn: a job
//     never holds two grants.
//   - A grant is for one attempt, used once: a job granted tokens asks the
//     router, and a later wait for a worker of the same attempt (capacity,
//     a tenant slot, a lost worker's job placed again, a publish that
//     failed) takes none again on this actor. A retry (retry.go) is a new
//     attempt, which calls the API again: it takes the job's units again
//     after its backoff, live, parked or adopted alike, and waits for them
//     as a first attempt does (in the queue's order, parking after
//     RateParkAfter).
//   - A job whose deadline (budget.deadline_ms) passes while it waits
//     leaves the queue and fails deadline_exceeded, naming the bucket.
//   - A job whose declaration can never be granted (an undeclared bucket,
//     units beyond the burst) fails rate_limit_invalid and is dead-lettered;
//     so does a job asking or waiting when a pools reload removes its
//     bucket or cuts its burst below the job's units (the limiter answers
//     Tokens{Invalid}).
//   - A job that leaves the wait for any reason (cancelled, its lock lost,
//     its actor stopped) leaves the limiter's queue (withdraw); units
//     granted to a job that no longer wants them go back to the limiter,
//     for the next waiter.

// RateRecheck is how often a job waiting for tokens asks the limiter again,
// in memory: the safety net for a lost grant (the job keeps its place).
const RateRecheck = 30 * time.Second

// TakeTokens asks the node's limiter for Units of Bucket; the answer comes
// back as a *Tokens with Epoch.
type TakeTokens struct {
	Bucket string
	Units  int
	Epoch  uint64
}

// LeaveTokens takes the job's ask under Epoch out of Bucket's queue, and
// gives back Return units it was granted and will not use.
type LeaveTokens struct {
	Bucket string
	Epoch  uint64
	Return int
}

func (TakeTokens) effect()  {}
func (LeaveTokens) effect() {}

// Tokens is the limiter's answer to the ask under Epoch: the units are the
// job's (Granted), or it waits for them (the grant follows).
type Tokens struct {
	Epoch   uint64
	Granted bool
	// Bucket and Units: the ask's (a grant nobody wants is given back).
	Bucket string
	Units  int
	// Invalid, when set, says why the ask can never be granted (a pools
	// reload removed the bucket or cut its burst below Units): the job
	// fails rate_limit_invalid. Granted is then false.
	Invalid string
}

// rateWait is the job's token wait (the actor's memory).
type rateWait struct {
	bucket  string
	units   int
	problem string
	epoch   uint64
	// asking: TakeTokens is the outstanding step; queued: the limiter
	// holds the job's place; granted: the job has its units.
	asking, queued, granted bool
	// resolved: bucket, units and problem are read (from the request).
	resolved bool
	// parked: the ask went with the park (ParkTokens): its answer is for
	// the job's next actor. woken: the grant came with the actor's wake
	// and is not yet used (given back if the job leaves).
	parked, woken bool
	// attempt: the attempt the grant is for (a woken grant's: the
	// record's, learnt as it is used).
	attempt int
	// parkAt: when the wait parks (zero: not waiting).
	parkAt time.Time
}

// ParkTokens keeps the job's ask under Epoch in Bucket's queue while the
// job parks: its epoch becomes 0 there, and the limiter's answer (granted,
// or never) goes to the job's next actor as a *Tokens through the node.
type ParkTokens struct {
	Bucket string
	Units  int
	Epoch  uint64
}

func (ParkTokens) effect() {}

// rateGate is the step before the router: it reports whether the job must
// first get its tokens (and has started to).
func (j *Job) rateGate() bool {
	r := &j.rate
	if r.granted {
		if r.woken {
			r.woken, r.attempt = false, j.Attempt() // used
		}
		if r.attempt == j.Attempt() {
			return false
		}
		// The grant was an earlier attempt's: a retry (retrying), or a
		// later attempt adopted by this actor after its lock lapsed
		// (another node ran and retried the job meanwhile).
		r.granted = false
	}
	if j.cfg.RateLimit == nil || j.Req == nil {
		return false
	}
	if !r.resolved {
		r.resolved = true
		r.bucket, r.units, r.problem = j.cfg.RateLimit(j.Req)
	}
	if r.problem != "" {
		j.fail(jobstate.ReasonRateLimitInvalid, r.problem, "")
		return true
	}
	if r.bucket == "" {
		return false
	}
	if dl, ok := j.budgetDeadline(); ok && !j.now().Before(dl) {
		j.leaveTokens(0)
		j.fail(jobstate.ReasonDeadlineExceeded, "waited for rate limit bucket "+r.bucket+" until the job's deadline",
			jobstate.ReasonRateLimited)
		return true
	}
	j.opEpoch++
	j.busy = true
	r.epoch, r.asking = j.opEpoch, true
	j.emit(TakeTokens{Bucket: r.bucket, Units: r.units, Epoch: r.epoch})
	return true
}

// budgetDeadline is when the job's budget (deadline_ms) ends, if it has one.
func (j *Job) budgetDeadline() (time.Time, bool) {
	ms := j.Req.GetBudget().GetDeadlineMs()
	if ms <= 0 {
		return time.Time{}, false
	}
	created := j.created
	if created.IsZero() {
		created = j.firstEvent
	}
	if created.IsZero() {
		created = j.now()
	}
	return created.Add(time.Duration(ms) * time.Millisecond), true
}

// onTokens handles the limiter's answer: the reply to the job's ask, or
// the grant that ends its wait (in order with other events).
func (j *Job) onTokens(m *Tokens) {
	r := &j.rate
	answer := m.Granted || m.Invalid != ""
	switch {
	case r.parked && (j.res == Parked || j.busy):
		// The ask went with the park: its answer is the next actor's (a
		// park under way defers it; finishIn passes it on).
		if !answer {
			return
		}
		if j.busy {
			j.deferred = append(j.deferred, m)
			return
		}
		j.emit(Redeliver{Msgs: []any{m}})
		return
	case j.res == Fresh && !r.asking && !r.queued && !r.granted:
		// The wake of a parked wait: the grant is the job's, to use once
		// the job is activated (or give back).
		if !answer {
			return
		}
		r.bucket, r.units = m.Bucket, m.Units
		if m.Granted {
			r.granted, r.woken = true, true
		}
		if j.firstEvent.IsZero() {
			j.firstEvent = j.now()
		}
		if !j.busy {
			j.activate(false, nil)
		}
		return
	case m.Granted && m.Epoch != r.epoch && r.queued && !j.res.Gone() && m.Bucket == r.bucket && m.Units == r.units:
		// A grant to an earlier ask of the job (its parked ask, granted
		// as it was asked again): it ends the wait, and the later ask
		// leaves the queue.
		if j.busy {
			j.deferred = append(j.deferred, m)
			return
		}
		j.disarm()
		j.leaveTokens(0)
		j.tokensGranted()
		return
	}
	if j.res.Gone() || m.Epoch != r.epoch || !r.asking && !r.queued {
		if m.Granted {
			// Granted to an ask no longer made: back to the limiter.
			j.emit(LeaveTokens{Bucket: m.Bucket, Epoch: m.Epoch, Return: m.Units})
		}
		return
	}
	if r.asking {
		if !j.busy || m.Epoch != j.opEpoch {
			return
		}
		r.asking, j.busy = false, false
		if m.Invalid != "" {
			j.tokensInvalid(m.Invalid)
		} else if m.Granted {
			j.tokensGranted()
		} else {
			j.waitTokens()
		}
		j.drain()
		return
	}
	if !m.Granted && m.Invalid == "" {
		return
	}
	if j.busy {
		j.deferred = append(j.deferred, m)
		return
	}
	j.disarm()
	if m.Invalid != "" {
		j.tokensInvalid(m.Invalid)
		return
	}
	j.tokensGranted()
}

// tokensInvalid: the limiter will never grant the ask (its bucket was
// removed or its burst cut below the units): the job leaves the wait and
// fails rate_limit_invalid, dead-lettered.
func (j *Job) tokensInvalid(why string) {
	j.rate.queued = false
	j.rate.problem = why
	j.fail(jobstate.ReasonRateLimitInvalid, why, jobstate.ReasonRateLimited)
}

func (j *Job) tokensGranted() {
	j.rate.queued, j.rate.parkAt = false, time.Time{}
	j.rate.granted, j.rate.attempt = true, j.Attempt()
	j.askRouter()
}

// waitTokens: the limiter queued the job. The wait is written once
// (SCHEDULED rate_limited, the bucket and units), then the job waits for
// the grant, its deadline or a recheck.
func (j *Job) waitTokens() {
	r := &j.rate
	r.queued = true
	if r.parkAt.IsZero() {
		r.parkAt = j.now().Add(j.cfg.RateParkAfter)
	}
	at := j.now().Add(RateRecheck)
	if dl, ok := j.budgetDeadline(); ok && dl.Before(at) {
		at = dl
	}
	if j.live() && j.State == jobstate.StateScheduled && j.LastReason == jobstate.ReasonRateLimited {
		j.parkTokens(at)
		return
	}
	j.apply(&jobstate.Transition{Expect: expectUnplaced,
		Path: []jobstate.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonRateLimited}}, Due: -1,
		Fields: []string{"last_reason", string(jobstate.ReasonRateLimited), "rate_bucket", r.bucket,
			"rate_units", strconv.Itoa(r.units)}},
		nil, j.pend(pending{then: nParkTokens, at: at,
			applied: []Effect{j.logFx(debug, "job waits for rate limit tokens", "bucket", r.bucket, "units", r.units)}}))
}

// parkTokens parks the job whose wait for tokens is written and has lasted
// RateParkAfter, keeping its place in the limiter's queue; or, before then
// (the timer is armed for the park time, which asks the limiter again, in
// memory, then parks), on a node that does not park (or
// while deliveries wait to be acked or events to be handled — a cancel
// that woke the job —, or the lock is not held), arms the job's timer for
// at (the recheck, or the deadline).
func (j *Job) parkTokens(at time.Time) {
	r := &j.rate
	lv := j.LockValue
	if j.cfg.RateParkAfter <= 0 || lv == "" || len(j.acks) > 0 || len(j.deferred) > 0 || !j.live() || j.busy || !r.queued || r.asking {
		j.arm(at)
		return
	}
	if j.now().Before(r.parkAt) {
		j.arm(minTime(at, r.parkAt))
		return
	}
	j.disarm()
	j.emit(ParkTokens{Bucket: r.bucket, Units: r.units, Epoch: r.epoch})
	r.epoch, r.parked = 0, true
	var due int64
	if dl, ok := j.budgetDeadline(); ok {
		due = dl.UnixMilli()
	}
	// Not renewed from now on (see park).
	j.emitForget(Forget{LockValue: lv})
	j.LockValue = ""
	j.write(j.pend(pending{kind: wPark, op: Op{Kind: OpPark, JobID: j.ID, Node: j.cfg.NodeID,
		LockValue: lv, ParkDue: due}}))
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// parkedTokens: the park write answered. Parked: the ask is the limiter's
// now (this actor leaves nothing). Not: the job activates again (recover),
// knowing its ask as the parked one (epoch 0).
func (j *Job) parkedTokens(parked bool) {
	r := &j.rate
	if !r.parked {
		return
	}
	if parked {
		r.queued = false
		return
	}
	r.parked = false
}

// adoptTokens: an activation found the job's wait for tokens written
// (SCHEDULED rate_limited): its ask may be parked in this node's limiter
// (epoch 0), so the actor knows it, to ask again or leave it.
func (j *Job) adoptTokens(f map[string]string) {
	r := &j.rate
	if r.granted || r.queued || r.asking || jobstate.State(f["s"]) != jobstate.StateScheduled ||
		f["reason"] != string(jobstate.ReasonRateLimited) || f["rate_bucket"] == "" {
		return
	}
	r.bucket = f["rate_bucket"]
	r.units, _ = strconv.Atoi(f["rate_units"])
	r.queued, r.epoch = true, 0
}

// leaveTokens takes the job out of the limiter's queue (and gives back ret
// granted units).
func (j *Job) leaveTokens(ret int) {
	r := &j.rate
	if r.woken {
		ret += r.units // a wake's grant never used
		r.woken, r.granted = false, false
	}
	if r.queued || r.asking || ret > 0 {
		j.emit(LeaveTokens{Bucket: r.bucket, Epoch: r.epoch, Return: ret})
	}
	r.queued, r.asking, r.parkAt = false, false, time.Time{}
}

// RateWait reports the bucket the job waits for ("": none).
func (j *Job) RateWait() string {
	if j.rate.queued || j.rate.asking {
		return j.rate.bucket
	}
	return ""
}
