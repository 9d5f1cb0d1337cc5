package lifecycle

import (
	"strconv"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// Dispatch: asking the router for a worker, waiting for capacity, the
// tenant's concurrency slot, the dispatch itself and its resends, the wait
// for the worker (deadlines, parking), its start, and its loss.

// askRouter asks for a worker; the answer arrives as a *PickReply.
// With no room the router queues the job (see waitCapacity).
func (j *Job) askRouter() {
	if j.rateGate() {
		return // its tokens first (ratewait.go)
	}
	j.dropPick()
	j.opEpoch++
	j.busy = true
	if !j.queued {
		j.ticket++
		j.ticketFor = j.Attempt()
	}
	submitted := j.created
	if submitted.IsZero() {
		submitted = j.firstEvent
	}
	j.emitAskRouter(AskRouter{Req: &PickRequest{JobID: j.ID, Req: j.Req, Epoch: j.opEpoch,
		Wait: true, Ticket: j.ticket, Submitted: submitted}})
}

func (j *Job) onPick(p *PickReply) {
	if p.Queued {
		j.waitCapacity(p)
		return
	}
	j.queued = false // placed (or refused) on a recheck: not queued any more
	// Nor waiting within its grace (a recheck or a repeated submit was
	// answered): its budget and its submit's touches are released here,
	// as a placement's are (onPlaced), before the job is written.
	j.leaveGrace()
	if p.Reason != "" {
		j.placementFailed(p)
		return
	}
	j.picked = p.WorkerID
	limit := j.tenantLimit()
	if limit <= 0 || j.admitted {
		j.keyThenDispatch(p)
		return
	}
	// The tenant has a concurrency limit: take a slot (shared by every
	// replica) before dispatching, or wait like any transient failure.
	j.admitAt = j.now()
	j.write(j.pend(pending{kind: wAdmit, pick: p, op: Op{Kind: OpAdmit, JobID: j.ID,
		TenantKey: j.cfg.TenantKey(jobstate.TenantOf(j.Req)), Limit: limit}}))
}

func (j *Job) admittedTo(p *pending, r *WriteResult) {
	if !r.Admitted {
		j.dropPick()
		j.placementFailed(&PickReply{Reason: jobstate.ReasonTenantLimit,
			Detail: "tenant " + jobstate.TenantOf(j.Req) + " has " + strconv.Itoa(p.op.Limit) + " jobs running"})
		return
	}
	j.admitted = true
	j.keyThenDispatch(p.pick)
}

// TenantSlotFresh: a dispatch made durable this long or longer after the
// job asked for its tenant's concurrency slot is not published; the job
// goes back to SCHEDULED (its slot given back) and asks again. The node's
// repair of tenant slots (recovery.TenantSlotGrace) frees a slot older than
// twice this whose job is not DISPATCHED or RUNNING (a slot's age counts
// from the job's last ask: admit.lua moves a held slot's score to the ask,
// or a re-ask in a slot taken long before could be freed at once after
// it, seeds 3100 and 4075): a dispatch write that
// landed that late (a stalled node or connection, writes retried through
// an outage, a long wait for a key's slot) may have landed after such a
// repair gave its slot to another job of the tenant.
const TenantSlotFresh = 30 * time.Second

// msgTenantSlotStale is the log message of a dispatch not published
// because its tenant slot was asked for too long before (TenantSlotFresh).
const msgTenantSlotStale = "dispatch recorded too long after its tenant slot was granted; not published, asking again"

// tenantSlotStale: the dispatch just made durable rests on a tenant slot
// asked for TenantSlotFresh or longer ago (or taken by an earlier actor of
// the job, when is not known), which the node's repair may have given to
// another job meanwhile; it is not published: the job goes back to
// SCHEDULED (tenant_limit), which gives the slot back, and asks for a
// worker and a slot again.
func (j *Job) tenantSlotStale() bool {
	if !j.admitted || j.now().Sub(j.admitAt) < TenantSlotFresh {
		return false
	}
	j.log(warn, msgTenantSlotStale, "tenant", jobstate.TenantOf(j.Req), "asked", j.admitAt, "worker", j.Worker)
	j.withholdDispatch(jobstate.ReasonTenantLimit, nRetryTenant)
	return true
}

// Record fields of a dispatch write on a slot (see adoptedSlotStale):
// fieldTenantAsked and fieldKeyAsked, when the job asked for its tenant's
// and its key's slot (unix ms on the node's clock, the clock of the slots'
// scores; "" none); fieldLanded, set by the write's script to Redis's TIME
// when it lands (the store replaces the value landedNow).
const (
	fieldTenantAsked = "tsat"
	fieldKeyAsked    = "ksat"
	fieldLanded      = jobstate.FieldLanded
	landedNow        = jobstate.LandedNow
)

// AdoptedSlotStale: the adopter of a DISPATCHED record withholds its
// dispatch when the record landed this long or longer after the job asked
// for the slot it rests on. Longer than TenantSlotFresh (and KeySlotFresh)
// by half of it, shorter than the repair's grace (twice it) by as much:
// the landing is timed on Redis's clock and the ask on the node's, and a
// skew of up to 15 s either way must neither withhold a dispatch its first
// owner published (landed and answered within TenantSlotFresh) nor resend
// one the repair may have robbed of its slot (landed a grace after the
// ask).
const AdoptedSlotStale = TenantSlotFresh + TenantSlotFresh/2

// slotAskFields adds to a dispatch write when the job asked for the slots
// it rests on, and asks the write's script to stamp its landing; a write
// over a record that may hold an earlier dispatch's asks clears them.
func (j *Job) slotAskFields(fields []string, fresh bool) []string {
	clear := j.asksSet && !fresh
	stamped := false
	switch {
	case j.admitted:
		fields = append(fields, fieldTenantAsked, j.askedMs(j.admitAt))
		stamped = true
	case clear:
		fields = append(fields, fieldTenantAsked, "")
	}
	switch {
	case j.ks.asked && j.concurrencyKey() != "":
		fields = append(fields, fieldKeyAsked, j.askedMs(j.ks.askedAt))
		stamped = true
	case clear:
		fields = append(fields, fieldKeyAsked, "")
	}
	if stamped {
		fields = append(fields, fieldLanded, landedNow)
	}
	j.asksSet = stamped
	return fields
}

// askedMs is a slot ask's time as a record field: unix ms, "0" when the
// ask is not known (a slot taken by an earlier actor of the job).
func (j *Job) askedMs(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return j.formatMs(t)
}

// adoptedSlotStale: an adopted DISPATCHED record whose dispatch landed
// AdoptedSlotStale or longer after the job asked for its tenant's or its
// key's slot is withheld, as its first owner withheld it (or would have,
// had it lived to see the write's reply: tenantSlotStale, keySlotStale):
// the node's repair may have given the slot to another job before the
// write landed, so the request is not sent again (a resend on a result
// stream's loss, seed 837): the job goes back to SCHEDULED and asks for its
// slot anew. Such a dispatch was never published — its owner's reply came
// later than the landing — so no worker holds it. A record with no asks
// (written before these fields, or back after Redis lost it) is adopted
// as before.
func (j *Job) adoptedSlotStale(f map[string]string) bool {
	if j.State != jobstate.StateDispatched {
		return false
	}
	landed, err := strconv.ParseInt(f[fieldLanded], 10, 64)
	if err != nil {
		return false
	}
	stale := func(asked string) (time.Time, bool) {
		ms, err := strconv.ParseInt(asked, 10, 64)
		if err != nil {
			return time.Time{}, false
		}
		return time.UnixMilli(ms), time.Duration(landed-ms)*time.Millisecond >= AdoptedSlotStale
	}
	if at, ok := stale(f[fieldTenantAsked]); ok {
		j.log(warn, msgTenantSlotStale, "tenant", jobstate.TenantOf(j.Req), "asked", at, "worker", j.Worker,
			"adopted", true)
		j.withholdDispatch(jobstate.ReasonTenantLimit, nRetryTenant)
		return true
	}
	if at, ok := stale(f[fieldKeyAsked]); ok {
		j.ks.asked = true // its slot, held still, is given back should the job end
		j.log(warn, msgKeySlotStale, "key", j.concurrencyKey(), "asked", at, "worker", j.Worker, "adopted", true)
		j.withholdDispatch(jobstate.ReasonConcurrencyKey, nRetryKey)
		return true
	}
	return false
}

// withholdDispatch takes back a dispatch made durable but not published
// (its slot may have been given away): DISPATCHED → SCHEDULED for reason,
// then the job asks again (then).
func (j *Job) withholdDispatch(reason jobstate.Reason, then next) {
	j.disarm()
	j.transition(&jobstate.Transition{Expect: jobstate.Expect(jobstate.StateDispatched),
		Path: []jobstate.Hop{{To: jobstate.StateScheduled, Reason: reason}}, Due: -1,
		Fields: []string{"last_reason", string(reason)}}, nil,
		j.pend(pending{then: then}))
}

// tenantLimit is the job's tenant concurrency limit (0: none): the node's
// per-tenant setting, lowered by the policy's max_concurrent_jobs.
func (j *Job) tenantLimit() int {
	limit := 0
	if j.cfg.TenantLimit != nil {
		limit = j.cfg.TenantLimit(jobstate.TenantOf(j.Req))
	}
	if j.policyLimit > 0 && (limit == 0 || j.policyLimit < limit) {
		limit = j.policyLimit
	}
	return limit
}

// expectUnplaced is the Expect of a job's first placement (PENDING or
// SCHEDULED), joined once: a join per dispatch was an allocation a job.
var expectUnplaced = jobstate.Expect(jobstate.StatePending, jobstate.StateScheduled)

// dispatchTo records the job as dispatched to the picked worker; the
// request is published once that is durable (dispatched).
func (j *Job) dispatchTo(p *PickReply) {
	// Room for the policy decision's fields, which apply adds, and for the
	// history fields of a create (historyFields: submitted, waited): one
	// block with the transition and its path. (16 here grew it once per
	// job: 20 fields with the flags, the pool and a wait within the grace.)
	t := newTransition(expectUnplaced, 24+len(j.decision))
	if j.State == jobstate.StatePending {
		t.Path = append(t.Path, jobstate.Hop{To: jobstate.StateScheduled, Reason: jobstate.ReasonAllowed})
	}
	t.Path = append(t.Path, jobstate.Hop{To: jobstate.StateDispatched, Reason: jobstate.ReasonDispatched})
	j.attempts++
	dl := j.deadlineFor(jobstate.StateDispatched)
	if p.StartsOnDelivery {
		// The worker will not say when it starts (stock CAP workers send
		// no progress): the job is bounded by its run, not by the wait for
		// a start that never gets reported.
		dl = j.deadlineFor(jobstate.StateRunning)
	}
	fields := append(t.Fields, "worker", p.WorkerID, "subj", p.Subject, "attempts", strconv.Itoa(j.attempts),
		"deadline", j.formatMs(dl.at), "deadline_kind", string(dl.why))
	fresh := !j.live()
	fields = appendFlag(fields, fresh, "tslot", j.admitted)
	fields = appendFlag(fields, fresh, "resend", p.Resend)
	fields = appendFlag(fields, fresh, "sod", p.StartsOnDelivery)
	fields = j.slotAskFields(fields, fresh)
	if j.runnerSet && !fresh {
		// Whoever ran an earlier dispatch (an attempt retried, a job
		// placed again) is not this one's runner: an adopter must not
		// take the new worker for it (seed 2653).
		fields = append(fields, "runner", "")
	}
	j.runnerSet = false
	if p.Pool != "" {
		fields = append(fields, "pool", p.Pool)
	}
	fields = j.keyFields(fields)
	t.Due, t.Fields = dl.at.UnixMilli(), fields
	j.apply(t, nil, j.pend(pending{then: nDispatched, pick: p, dl: dl}))
}

// dispatched: DISPATCHED is durable; publish the request.
func (j *Job) dispatched(p *pending) {
	j.Worker, j.Subject, j.pool = p.pick.WorkerID, p.pick.Subject, p.pick.Pool
	j.picked = ""
	j.retryAt = time.Time{}
	j.resend, j.resends = p.pick.Resend, 0
	j.startsOnDelivery = p.pick.StartsOnDelivery
	j.deadline, j.deadlineWhy = p.dl.at, p.dl.why
	// A new dispatch: its runner is not known until a worker speaks for
	// it (on a pool subject NATS picks the receiver).
	j.runnerKnown, j.lostNoted = false, false
	if j.keySlotStale() || j.tenantSlotStale() {
		return
	}
	j.emitPublish(PublishRequest{Subject: j.Subject})
	if j.startsOnDelivery {
		// Started on delivery as far as anyone can tell: the worker's
		// eviction must not place it again (it may be running, on that
		// worker or — on a pool subject — on another); its run's deadline
		// bounds it.
		j.release(false)
	}
	j.count(MDispatched, "")
	j.observe(MDispatchLatency, j.firstEvent)
	j.waitWorker()
}

// onPublishFailed: the dispatch just recorded could not be published; the
// job goes back to SCHEDULED and retries.
func (j *Job) onPublishFailed(m *PublishFailed) {
	if j.res.Gone() || j.busy || j.State != jobstate.StateDispatched {
		return
	}
	j.log(warn, "dispatch publish failed", "subject", j.Subject, "err", m.Err)
	j.disarm()
	j.transition(&jobstate.Transition{Expect: jobstate.Expect(jobstate.StateDispatched),
		Path: []jobstate.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonDispatchFailed}}, Due: -1}, nil,
		j.pend(pending{then: nRetryLater}))
}

// deadlineFor returns when a job entering state times out, and why: the
// state's own timeout or the job's budget deadline, whichever is first.
func (j *Job) deadlineFor(state jobstate.State) deadline {
	now := j.now()
	d := deadline{now.Add(j.cfg.Dispatch), jobstate.ReasonDispatchTimeout}
	if state == jobstate.StateRunning {
		d = deadline{now.Add(j.cfg.RunningFor(j.topic())), jobstate.ReasonRunningTimeout}
	}
	created := j.created
	if created.IsZero() {
		created = now // not yet written: it is being created now
	}
	if ms := j.Req.GetBudget().GetDeadlineMs(); ms > 0 {
		if b := created.Add(time.Duration(ms) * time.Millisecond); b.Before(d.at) {
			d = deadline{b, jobstate.ReasonDeadlineExceeded}
		}
	}
	return d
}

// watchDeadline arms the deadline of a DISPATCHED or RUNNING job, or times
// it out if the deadline has passed, repeats its dispatch when a resend is
// due, or parks the job once it has waited ParkAfter.
func (j *Job) watchDeadline() {
	if j.deadline.IsZero() {
		d := j.deadlineFor(j.State)
		j.deadline, j.deadlineWhy = d.at, d.why
	}
	now := j.now()
	switch {
	case !now.Before(j.deadline):
		j.timeout()
	case j.parkAt.IsZero():
		j.waitWorker()
	case j.resendDue(now):
		j.resendDispatch(now)
	case !now.Before(j.parkAt) && !j.parkHeld():
		j.park()
	default:
		j.armWait()
	}
}

// waitWorker starts the wait of a job that is with its worker: its one
// timer fires at the deadline or, when sooner, when its dispatch is to be
// repeated or it parks.
func (j *Job) waitWorker() {
	now := j.now()
	j.parkAt = time.Time{}
	if j.cfg.ParkAfter > 0 {
		j.parkAt = now.Add(j.cfg.ParkAfter)
	}
	j.resendAt = time.Time{}
	if j.State == jobstate.StateRunning {
		j.recall = false // it started: the worker has it
	}
	if j.resend && (j.State == jobstate.StateDispatched || j.recall) && j.cfg.ResendAfter > 0 && j.Req != nil {
		j.resendAt = now.Add(j.resendDelay())
	}
	j.armWait()
}

func (j *Job) armWait() {
	at := j.deadline
	if !j.parkAt.IsZero() && j.parkAt.Before(at) && !j.parkHeld() {
		at = j.parkAt
	}
	if j.resendPending() && j.resendAt.Before(at) {
		at = j.resendAt
	}
	j.arm(at)
}

// Resending a dispatch. A direct dispatch is one core NATS publish: it is
// lost if the server restarts or the worker is reconnecting at that moment,
// and nothing tells the node. A worker that dedupes by job id lets the node
// repeat the publish while the job is DISPATCHED with no sign of the
// worker; a worker that already holds the job answers the repeat with a
// RUNNING progress, which ends the repeats.

func (j *Job) resendPending() bool {
	return (j.State == jobstate.StateDispatched || j.recall) && !j.resendAt.IsZero()
}

func (j *Job) resendDue(now time.Time) bool { return j.resendPending() && !now.Before(j.resendAt) }

// parkHeld: a DISPATCHED job parks only once its resends are spent.
func (j *Job) parkHeld() bool { return j.resendPending() && j.resends < ResendsBeforePark }

// resendDelay is the wait before repeat number resends+1.
func (j *Job) resendDelay() time.Duration {
	d := ResendCap
	if j.resends < 8 {
		d = min(j.cfg.ResendAfter<<j.resends, ResendCap)
	}
	return d
}

// resendDispatch repeats the dispatch to the same subject, or, while the
// node's NATS connection is down, waits a second for it to come back.
func (j *Job) resendDispatch(now time.Time) {
	if !j.in.Connected() {
		j.resendAt = now.Add(time.Second)
		j.armWait()
		return
	}
	j.emitPublish(PublishRequest{Subject: j.Subject, Resend: true})
	j.count(MResent, "")
	j.resends++
	j.resendAt = now.Add(j.resendDelay())
	j.armWait()
}

// onResultsLost: the result stream was recreated, so a result the job's
// worker sent may have gone with it, and nothing else would end the job
// before its deadline (hours, once RUNNING). A worker that dedupes by job id
// answers a repeat of a job it finished with its result again, and of one
// it still runs with a RUNNING progress; the dispatch is repeated, as for a
// lost dispatch, until it answers. Other workers would run the job again:
// their jobs wait for their results or deadlines, as before.
func (j *Job) onResultsLost() {
	if j.State != jobstate.StateDispatched && j.State != jobstate.StateRunning || !j.resend || j.Req == nil ||
		j.cfg.ResendAfter <= 0 {
		return
	}
	j.log(info, "result stream recreated; asking the worker again", "worker_id", j.Worker, "state", j.State)
	j.recall, j.resends = true, 0
	if j.parkAt.IsZero() {
		j.waitWorker()
	}
	j.resendAt = j.now()
	j.watchDeadline()
}

// waitCapacity keeps a job the router has queued for room. The wait costs
// no Redis traffic: SCHEDULED with its reason is written when the wait
// begins or its reason changes, with no due time (the lock, kept by the
// node lease, covers the job; a graceful stop hands it on). A recheck in
// memory every CapacityRecheck guards against a lost wake. A pool with
// workers but no room, or a paused topic, is waited on for as long as it
// takes; a pool with no
// live workers is rechecked on the scheduling backoff and counts attempts,
// so a pool that never gets a worker fails the job (max_scheduling_retries).
func (j *Job) waitCapacity(p *PickReply) {
	again := j.queued
	j.queued = true
	changed := !again || j.capReason != p.Reason
	j.capReason = p.Reason
	if !waitsUnbounded(p.Reason) {
		j.attempts++
		if j.attempts >= j.cfg.MaxSchedulingAttempts {
			j.withdraw()
			j.fail(jobstate.ReasonMaxSchedulingRetries,
				"no placement after "+strconv.Itoa(j.attempts)+" attempts: "+p.Detail, p.Reason)
			return
		}
		changed = changed || again
	}
	recheck := j.recheckDelay()
	if j.res == Unwritten {
		// Asked again within its grace (a recheck, a repeated submit):
		// still nothing is written, but a pool left with no live worker
		// shortens the grace.
		j.graceFor(p.Reason, j.now())
		j.armUnwritten()
		return
	}
	at := j.now().Add(recheck)
	if !changed && j.live() {
		j.arm(at)
		return
	}
	if !j.live() && j.cfg.CapacityGrace > 0 && j.in.GraceRoom() {
		j.waitUnwritten()
		return
	}
	j.writeWait(at)
}

// waitsUnbounded reports whether a wait for reason lasts as long as it
// takes, counting no scheduling attempt: a full pool (room comes), a
// paused topic (an operator resumes it). Every other wait is rechecked on
// the scheduling backoff and bounded by the attempts.
func waitsUnbounded(reason jobstate.Reason) bool {
	return reason == jobstate.ReasonPoolOverloaded || reason == jobstate.ReasonPoolPaused
}

// probe looks for the record of a job waiting within its grace, once, at
// the wait's first timer: its submit may repeat a job that exists (a
// client resubmitting, a SUBMIT stream lost and refilled). One activation
// that creates nothing takes such a job over, hands it to its holder or
// finds it ended, rather than holding it here as a new wait for up to the
// grace; a job with no record waits on (probedAbsent). At the first timer,
// not as the wait begins: most waits (a burst the pools drain) end sooner
// and cost no read.
func (j *Job) probe() {
	j.probed = true
	j.activate(false, j.pend(pending{probe: true}))
}

// probedAbsent: the job waiting within its grace has no record; it waits
// on as a new one.
func (j *Job) probedAbsent() {
	if j.queued {
		j.onUnwrittenTimer()
		return
	}
	// Placed meanwhile: the placement, deferred, is acted on first, so
	// that the job is created before an event deferred with it that needs
	// its record (a cancel) is handled.
	for i, m := range j.deferred {
		if pl, ok := m.(*Placed); ok {
			j.deferred = append(j.deferred[:i:i], j.deferred[i+1:]...)
			j.handle(pl)
			return
		}
	}
	j.leaveGrace()
	j.writeWait(j.now().Add(j.recheckDelay()))
}

// waitUnwritten starts a wait within the grace: nothing is written yet;
// the submit stays un-acked in JetStream (the node keeps telling
// JetStream it is in progress), which keeps it as durably. For its first
// AdmissionHold it still counts in the node's admissions.
func (j *Job) waitUnwritten() {
	now := j.now()
	recheck := j.recheckDelay()
	if !j.moveTo(Unwritten) {
		j.writeWait(now.Add(recheck))
		return
	}
	if j.waitedAt.IsZero() {
		j.waitedAt = now
	}
	j.graceEnd = now.Add(j.cfg.CapacityGrace)
	j.recheckAt = now.Add(recheck)
	j.graceFor(j.capReason, now)
	if j.cfg.CapacityGrace > j.cfg.AdmissionHold {
		j.holdEnd = now.Add(max(j.cfg.AdmissionHold, 0))
	}
	j.emitGrace(Grace{Delta: 1, Deliveries: j.acks})
	j.armUnwritten()
}

// graceFor shortens the grace of a wait with no live worker to wait for
// (reason other than pool_overloaded) to NoWorkersGrace from now: such a
// wait may last until the job fails, so it is shown in Redis soon, and not
// rechecked before.
func (j *Job) graceFor(reason jobstate.Reason, now time.Time) {
	if reason == jobstate.ReasonPoolOverloaded {
		return
	}
	if end := now.Add(min(j.cfg.CapacityGrace, NoWorkersGrace)); end.Before(j.graceEnd) {
		j.graceEnd = end
	}
	j.recheckAt = j.graceEnd
}

// recheckDelay is how long a job waiting for room waits before it asks the
// router again: CapacityRecheck for a full pool (the safety net of a lost
// wake), the scheduling backoff when no worker is live.
func (j *Job) recheckDelay() time.Duration {
	if !waitsUnbounded(j.capReason) {
		return j.cfg.Backoff(max(j.attempts, 1))
	}
	return CapacityRecheck
}

// armUnwritten sets the timer of a job waiting within its grace to the
// first of: the end of its admission hold, its next recheck, the end of
// its grace.
func (j *Job) armUnwritten() {
	at := j.graceEnd
	if j.recheckAt.Before(at) {
		at = j.recheckAt
	}
	if !j.holdEnd.IsZero() && j.holdEnd.Before(at) {
		at = j.holdEnd
	}
	j.arm(at)
}

// onUnwrittenTimer: the timer of a job waiting within its grace fired. Its
// admission hold may be over (the node's fetch loops stop counting it), a
// recheck may be due (the safety net for a lost wake: the router is asked
// again, the job keeps its place), or the grace is over (the job still
// waits, now in Redis too).
func (j *Job) onUnwrittenTimer() {
	now := j.now()
	j.endHold(now)
	recheck := j.recheckDelay()
	if !now.Before(j.graceEnd) {
		j.writeWait(now.Add(recheck))
		return
	}
	if !j.probed {
		j.probe()
		return
	}
	if !now.Before(j.recheckAt) {
		j.recheckAt = now.Add(recheck)
		j.askRouter()
		return
	}
	j.armUnwritten()
}

// endHold ends the job's admission hold once it is due (zero now: at once).
func (j *Job) endHold(now time.Time) {
	if !j.holdEnd.IsZero() && (now.IsZero() || !now.Before(j.holdEnd)) {
		j.holdEnd = time.Time{}
		j.emit(Admitted{})
	}
}

// writeWait records that the job waits for capacity: SCHEDULED with the
// reason, no due time, then the recheck at at.
func (j *Job) writeWait(at time.Time) {
	j.leaveGrace()
	j.count(MCapacityWaits, string(j.capReason))
	j.apply(&jobstate.Transition{Expect: expectUnplaced,
		Path: []jobstate.Hop{{To: jobstate.StateScheduled, Reason: j.capReason}}, Due: -1,
		Fields: []string{"attempts", strconv.Itoa(j.attempts), "last_reason", string(j.capReason)}},
		nil, j.pend(pending{then: nArm, at: at}))
}

// leaveGrace ends a wait within the grace (written, placed or finished).
func (j *Job) leaveGrace() {
	if j.res == Unwritten {
		j.moveTo(Fresh)
		j.endHold(time.Time{})
		j.emitGrace(Grace{Delta: -1})
	}
}

// onPlaced acts on a placement the router made for the queued job.
func (j *Job) onPlaced(m *Placed) {
	if j.State != jobstate.StatePending && j.State != jobstate.StateScheduled ||
		m.Ticket != j.ticket || j.ticketFor != j.Attempt() {
		// Moved on meanwhile (dispatched on a recheck, cancelled, asked
		// again under a new ticket; or dispatched elsewhere and retried —
		// a placement held while the job was busy would run the retry
		// before its backoff and its rate limit tokens): the slot goes
		// back, and the job's own wait (its timer) stays.
		if m.Reply.WorkerID != "" {
			j.toRouter(&Released{WorkerID: m.Reply.WorkerID, JobID: j.ID, Done: true})
		}
		return
	}
	j.disarm()
	j.leaveGrace()
	j.onPick(m.Reply)
}

// dropPick tells the router that a pick this job was given will not be
// dispatched, so the slot it counted is freed.
func (j *Job) dropPick() {
	if j.picked != "" {
		j.toRouter(&Released{WorkerID: j.picked, JobID: j.ID, Done: true})
		j.picked = ""
	}
}

// withdraw takes the job out of the router's queue.
func (j *Job) withdraw() {
	j.leaveTokens(0)
	if j.queued {
		j.queued = false
		j.toRouter(&Withdraw{JobID: j.ID, Ticket: j.ticket})
	}
}

func (j *Job) placementFailed(p *PickReply) {
	if Permanent(p.Reason) {
		if j.firstFail.IsZero() {
			j.firstFail = j.now()
		}
		if j.now().Sub(j.firstFail) >= j.cfg.PermanentGrace {
			j.fail(p.Reason, p.Detail, "")
			return
		}
	}
	j.attempts++
	if j.attempts >= j.cfg.MaxSchedulingAttempts {
		j.fail(jobstate.ReasonMaxSchedulingRetries,
			"no placement after "+strconv.Itoa(j.attempts)+" attempts: "+p.Detail, p.Reason)
		return
	}
	j.count(MRetries, string(p.Reason))
	// Record the attempt, its reason and when the job wakes (PENDING →
	// SCHEDULED on the first, SCHEDULED → SCHEDULED after), then wait.
	at := j.now().Add(j.cfg.Backoff(j.attempts))
	j.apply(&jobstate.Transition{Expect: expectUnplaced,
		Path: []jobstate.Hop{{To: jobstate.StateScheduled, Reason: p.Reason}}, Due: at.UnixMilli(),
		Fields: []string{"attempts", strconv.Itoa(j.attempts), "last_reason", string(p.Reason)}},
		nil, j.pend(pending{then: nArm, at: at}))
}

// markRunning records DISPATCHED → RUNNING (or, after its worker was
// reported lost, RUNNING → RUNNING: it answered after all) and moves the
// deadline to the running timeout.
//
// from is the worker that spoke (the progress's sender; "" unknown). On a
// pool subject NATS chose the receiver: a worker other than the one picked
// speaking for the job runs it, so the job counts on that worker from now
// on — its loss, not the picked worker's, is the job's.
func (j *Job) markRunning(from string) {
	dl := j.deadlineFor(jobstate.StateRunning)
	fields := []string{"deadline", strconv.FormatInt(dl.at.UnixMilli(), 10), "deadline_kind", string(dl.why)}
	if from != "" {
		if from != j.Worker {
			if j.Worker != "" {
				j.toRouter(&Released{WorkerID: j.Worker, JobID: j.ID, Done: true})
			}
			j.toRouter(&Occupied{WorkerID: from, JobID: j.ID, Started: true, Heard: true})
			j.Worker = from
		}
		j.runnerKnown = true
		fields = append(fields, "worker", from, "runner", from)
		j.runnerSet = true
	}
	j.transition(&jobstate.Transition{Expect: jobstate.Expect(j.State),
		Path: []jobstate.Hop{{To: jobstate.StateRunning, Reason: jobstate.ReasonStarted}}, Due: dl.at.UnixMilli(),
		Fields: fields}, nil, j.pend(pending{then: nRunning, dl: dl}))
}

// onWorkerLost dispatches elsewhere a job whose worker was evicted before
// it started the job.
func (j *Job) onWorkerLost(m *WorkerLost) {
	if !active(j.State) || j.Worker != m.WorkerID {
		return
	}
	if j.State == jobstate.StateRunning || j.startsOnDelivery {
		j.lostWhileRunning(m.WorkerID, m.At)
		return
	}
	if j.cfg.Redispatch != nil && !j.cfg.Redispatch(j.topic()) {
		return
	}
	j.log(info, "worker lost; dispatching elsewhere", "topic", j.topic(), "worker_id", m.WorkerID)
	lost := m.WorkerID
	if j.lostWorkers != "" {
		lost = j.lostWorkers + "," + m.WorkerID
	}
	j.lostWorkers = lost
	j.transition(&jobstate.Transition{Expect: jobstate.Expect(jobstate.StateDispatched),
		Path: []jobstate.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonWorkerLost}}, Due: -1,
		Fields: []string{"lost_worker", m.WorkerID, "lost_workers", lost}}, nil, j.pend(pending{then: nAskRouter}))
}

// runnerUnknownDetail is the record's lost_detail when a started job's
// picked worker is lost and NATS chose its runner (short: a record's
// fields stay within Redis's compact hash encoding, 64 bytes a value).
const runnerUnknownDetail = "picked worker lost; runner unknown; ends at its deadline"

// lostWhileRunning: the worker of a started job was evicted. Running it
// again is not safe (it may have run, or still run); waiting for the job's
// own deadline (hours) is not useful either: the job ends FAILED
// worker_lost after WorkerLostGrace unless the worker's result or progress
// comes first. Only for a direct dispatch: on a pool subject the job may be
// running on another worker than the one Troupe picked.
//
// evicted is when the worker was evicted (zero: now): the grace runs from
// then, so a job adopted after the eviction does not get a fresh one.
func (j *Job) lostWhileRunning(worker string, evicted time.Time) {
	known := j.runnerKnown || j.direct()
	if !known {
		// Picked, but maybe not the one running it: the deadline decides;
		// the history says so, once.
		if j.lostNoted {
			return
		}
		j.lostNoted = true
		j.count(MRunnerUnknown, "")
		j.log(warn, "worker picked for a started job lost; its runner is unknown and may be lost too, so its deadline decides",
			"worker_id", worker, "deadline", j.deadline)
		j.transition(&jobstate.Transition{Expect: jobstate.Expect(j.State),
			Path:   []jobstate.Hop{{To: j.State, Reason: jobstate.ReasonWorkerLostRunnerUnknown}},
			Fields: []string{"lost_worker", worker, "lost_detail", runnerUnknownDetail}}, nil, j.pend(pending{then: nWatch}))
		return
	}
	grace := j.cfg.WorkerLostGrace
	if grace <= 0 || j.deadlineWhy == jobstate.ReasonWorkerLost {
		return
	}
	from := j.now()
	if !evicted.IsZero() && evicted.Before(from) {
		from = evicted
	}
	at := from.Add(grace)
	if !j.deadline.IsZero() && j.deadline.Before(at) {
		return // its own deadline comes first
	}
	j.log(warn, "worker of a started job lost; failing it unless the worker answers", "worker_id", worker,
		"grace", grace)
	j.transition(&jobstate.Transition{Expect: jobstate.Expect(j.State),
		Path: []jobstate.Hop{{To: j.State, Reason: jobstate.ReasonWorkerLost}}, Due: at.UnixMilli(),
		Fields: []string{"lost_worker", worker, "deadline", strconv.FormatInt(at.UnixMilli(), 10),
			"deadline_kind", string(jobstate.ReasonWorkerLost)}},
		nil, j.pend(pending{then: nDeadline, dl: deadline{at, jobstate.ReasonWorkerLost}}))
}
