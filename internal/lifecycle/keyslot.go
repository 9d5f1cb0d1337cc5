package lifecycle

import (
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Concurrency keys. A job may carry a key (meta.labels[LabelConcurrencyKey],
// e.g. a user or an agent); a key with a limit (Config.KeyLimit) has that
// many slots, shared by every replica. After the pick and the tenant's
// slot, and before DISPATCHED, the job takes one of its key's slots; with
// none free, by the key's strategy, it waits (written SCHEDULED with reason
// concurrency_key, among its node's waiters on the key, woken when a slot
// of the key is freed on any replica), is cancelled (cancel_newest), or has
// the key's oldest holder cancelled and waits first in line
// (cancel_in_progress). A job gives its slot back when it ends; one that
// ends CANCELLED while with its worker keeps it counted until its deadline
// (a stock worker hears no cancel and may still be running it).

// LabelConcurrencyKey is the meta.labels key naming a job's concurrency key.
const LabelConcurrencyKey = "troupe.concurrency_key"

// Key strategies (Config.KeyLimit's second value).
const (
	KeyQueue            = "queue"
	KeyCancelNewest     = "cancel_newest"
	KeyCancelInProgress = "cancel_in_progress"
)

// KeySlotFresh: a dispatch made durable this long or longer after the job
// asked for its key's slot is not published; the job goes back to
// SCHEDULED and asks again. The node's repair of key slots frees a slot
// older than twice this (troupe's keySlotGrace) whose job is not
// DISPATCHED or RUNNING: a dispatch write that landed that late (a stalled
// connection, writes retried through an outage) may have landed after
// such a repair gave its slot to another job.
const KeySlotFresh = 30 * time.Second

// msgKeySlotStale is the log message of a dispatch not published because
// its key slot was granted too long before (KeySlotFresh).
const msgKeySlotStale = "dispatch recorded too long after its concurrency key slot was granted; not published, asking again"

// KeyWaitGuard: a job waiting on its key asks again this long after its
// last try even if no wake came (a lost wake notice). The node also wakes
// its oldest waiter of each key now and then (see jobactor.KeyWaiters).
const KeyWaitGuard = 5 * time.Minute

// KeyOutcome is what an AskKeySlot found.
type KeyOutcome int

const (
	KeyAdmitted KeyOutcome = iota + 1 // the job holds a slot
	KeyWaiting                        // no slot: the job waits in the key's line
	KeyRefused                        // no slot, cancel_newest: the job is cancelled
)

// AskKeySlot asks for one of Limit slots of Key for the job, with
// Strategy; the answer comes back as a KeySlotDone with Epoch.
type AskKeySlot struct {
	Epoch    uint64
	Key      string
	Limit    int
	Strategy string
}

// KeySlotDone answers AskKeySlot. Err: the slots could not be read (the
// outcome is unknown; the job took nothing). Victim: cancel_in_progress
// named the key's oldest holder, to cancel.
type KeySlotDone struct {
	Epoch   uint64
	Outcome KeyOutcome
	Victim  string
	Err     error
}

// WaitKey adds (On) or removes the job among the node's waiters on Key.
type WaitKey struct {
	Key string
	On  bool
}

// ReleaseKey gives the job's slot of Key back and takes it out of the
// key's line; LingerUntil (non-zero) keeps the slot counted until then.
// Limit is the key's limit (0: none known): a freed slot goes straight to
// the key's oldest waiter, whose node wakes it (a KeyBack) and whose ask
// then finds the slot its own.
type ReleaseKey struct {
	Key         string
	LingerUntil time.Time
	Limit       int
}

// CancelJob publishes a JobCancel for JobID on the cancel subject: its
// holder, on any node, cancels it, and its worker hears it.
type CancelJob struct{ JobID, Reason string }

// KeyBack: a slot of the job's key was freed; a job waiting on it asks
// again.
type KeyBack struct{}

func (AskKeySlot) effect() {}
func (WaitKey) effect()    {}
func (ReleaseKey) effect() {}
func (CancelJob) effect()  {}

// keyState is the job's concurrency-key bookkeeping.
type keyState struct {
	pick    *PickReply // the pick waiting on the key's slot
	waiting bool       // among the node's waiters on the key
	asked   bool       // asked for a slot here: the key's line or slots may name the job
	askedAt time.Time  // when the job last asked for a slot (see KeySlotFresh)
}

// concurrencyKey is the job's key ("": none, or no limit configured).
func (j *Job) concurrencyKey() string {
	if j.cfg.KeyLimit == nil {
		return ""
	}
	return j.Req.GetMeta().GetLabels()[LabelConcurrencyKey]
}

// keyThenDispatch: after the pick (and the tenant's slot), the job takes
// one of its key's slots before it is dispatched.
func (j *Job) keyThenDispatch(p *PickReply) {
	key := j.concurrencyKey()
	if key == "" {
		j.dispatchTo(p)
		return
	}
	limit, strategy := j.cfg.KeyLimit(key)
	if limit <= 0 {
		j.dispatchTo(p)
		return
	}
	j.ks.pick, j.ks.asked, j.ks.askedAt = p, true, j.now()
	j.opEpoch++
	j.busy = true
	j.emit(AskKeySlot{Epoch: j.opEpoch, Key: key, Limit: limit, Strategy: strategy})
}

func (j *Job) onKeySlot(m *KeySlotDone) {
	p := j.ks.pick
	j.ks.pick = nil
	key := j.concurrencyKey()
	switch {
	case m.Err != nil:
		// Unknown: nothing taken; the pick goes back and the job asks
		// again after StateRetryDelay (fail closed, no attempt counted).
		j.dropPick()
		j.log(warn, "concurrency key slots unavailable; retrying", "key", key, "err", m.Err)
		j.count(MFailClosed, j.topic())
		j.retryIn(jobstate.ReasonStateUnavailable, StateRetryDelay)
	case m.Outcome == KeyAdmitted:
		j.stopWaitingKey()
		j.dispatchTo(p)
	case m.Outcome == KeyRefused:
		j.dropPick()
		j.stopWaitingKey()
		j.keyCancel(key)
	default:
		j.dropPick()
		if m.Victim != "" && m.Victim != j.ID {
			j.emit(CancelJob{JobID: m.Victim, Reason: string(jobstate.ReasonConcurrencyKeyCancelled) +
				": job " + j.ID + " of concurrency key " + key + " takes its place (cancel_in_progress)"})
		}
		j.waitKey(key)
	}
}

// waitKey keeps the job waiting for a slot of key: registered among the
// node's waiters (woken when a slot is freed), its wait written once
// (SCHEDULED, concurrency_key), its timer the KeyWaitGuard.
func (j *Job) waitKey(key string) {
	if !j.ks.waiting {
		j.ks.waiting = true
		j.emit(WaitKey{Key: key, On: true})
	} else {
		j.emit(WaitKey{Key: key, On: true}) // asked again: in line for the next wake
	}
	at := j.now().Add(KeyWaitGuard)
	if j.live() && j.State == jobstate.StateScheduled && j.LastReason == jobstate.ReasonConcurrencyKey {
		j.arm(at)
		return
	}
	j.count(MCapacityWaits, string(jobstate.ReasonConcurrencyKey))
	j.capReason = jobstate.ReasonConcurrencyKey
	j.apply(&jobstate.Transition{Expect: expectUnplaced,
		Path: []jobstate.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonConcurrencyKey}}, Due: -1,
		Fields: []string{"ckey", key, "last_reason", string(jobstate.ReasonConcurrencyKey)}},
		nil, j.pend(pending{then: nArm, at: at}))
}

// stopWaitingKey takes the job out of its node's waiters.
func (j *Job) stopWaitingKey() {
	if j.ks.waiting {
		j.ks.waiting = false
		j.emit(WaitKey{Key: j.concurrencyKey(), On: false})
	}
}

// onKeyBack: a slot of the job's key was freed; a job waiting on it asks
// for a worker, and the slot, again.
func (j *Job) onKeyBack() {
	if !j.ks.waiting || j.State != jobstate.StateScheduled || !j.live() {
		return
	}
	j.disarm()
	j.advance()
}

// keyCancel ends the job CANCELLED: its key has no free slot and its
// strategy is cancel_newest.
func (j *Job) keyCancel(key string) {
	msg := "concurrency key " + key + " has no free slot (strategy cancel_newest)"
	j.apply(&jobstate.Transition{Expect: expectUnplaced,
		Path:   []jobstate.Hop{{To: jobstate.StateCancelled, Reason: jobstate.ReasonConcurrencyKeyCancelled}},
		Fields: []string{"ckey", key, "cancel_reason", msg, "cancelled_by", "troupe"}}, nil,
		j.pend(pending{applied: []Effect{
			j.logFx(info, "job cancelled: its concurrency key is full", "topic", j.topic(), "key", key),
			TellClient{Status: capv1.JobStatus_JOB_STATUS_CANCELLED, Code: jobstate.ReasonConcurrencyKeyCancelled, Msg: msg},
		}}))
}

// keyMoved: the job went from → to (durable). A job that asked for a slot
// and ends gives it back (and leaves the key's line); one cancelled while
// with its worker keeps it counted until its deadline.
func (j *Job) keyMoved(from, to jobstate.State) {
	if !to.Terminal() {
		return
	}
	key := j.concurrencyKey()
	if key == "" {
		return
	}
	limit, _ := j.cfg.KeyLimit(key)
	if limit <= 0 && !j.ks.asked {
		return
	}
	j.stopWaitingKey()
	var linger time.Time
	if active(from) && to == jobstate.StateCancelled && j.deadline.After(j.now()) {
		linger = j.deadline
	}
	j.emit(ReleaseKey{Key: key, LingerUntil: linger, Limit: max(limit, 0)})
}

// keySlotStale: the dispatch just made durable rests on a key slot
// granted KeySlotFresh or longer ago, which the node's repair may have
// given to another job meanwhile; it is not published: the job goes back
// to SCHEDULED (concurrency_key) and asks for a worker, and the slot,
// again (holding it still, it keeps it).
func (j *Job) keySlotStale() bool {
	if !j.ks.asked || j.concurrencyKey() == "" || j.now().Sub(j.ks.askedAt) < KeySlotFresh {
		return false
	}
	j.log(warn, msgKeySlotStale, "key", j.concurrencyKey(), "asked", j.ks.askedAt, "worker", j.Worker)
	j.withholdDispatch(jobstate.ReasonConcurrencyKey, nRetryKey)
	return true
}

// keyFields adds the key to a dispatch's fields.
func (j *Job) keyFields(fields []string) []string {
	if j.ks.asked {
		fields = append(fields, "ckey", j.concurrencyKey())
	}
	return fields
}
