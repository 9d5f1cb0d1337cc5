package intake

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Results go to their job's owner without a forward (issue 33).
//
// Stock CAP workers publish every result on the one result subject, and the
// result stream's shared consumer hands each to any replica — with N
// replicas, (N-1)/N of them to one that does not run the job. So besides
// the shared consumer every node subscribes to the result subject itself
// (core NATS, HandleOwnResult): every result reaches every node, which
// keeps those of the jobs with a live actor here and drops the rest — a
// job parked here too: waking its actor from a copy NATS does not pace
// started an actor per parked job when a hold's answers came at once
// (200,000 held: 1.8–2.6 GB of node RSS), so a parked job's result comes
// through the shared, flow-controlled copy. That copy is only a fast path:
// it is not stored, not acked, and a node that misses it (disconnected,
// too slow) loses nothing.
//
// The shared consumer's copy answers for the result, and leaves the stream
// only once the job's record shows it handled: the replica that takes it
// waits OwnConfirmFirst and reads the job's state (Store.States, one
// pipeline per batch); a terminal job (or, for a progress report, a
// running one) is what the job's actor makes of the result, and the copy
// is acked unread. The owner itself needs no read: its job actor settled
// its own copy after writing (settledSet), which it remembers; a copy whose
// result it heard for a job live here (it holds the job's lock) waits,
// unread, for that settle, at most ownLiveWait, and a copy of a job live
// here whose result it did not hear goes to that job's actor at once.
// Otherwise it reads again after OwnConfirmAgain and then handles the copy
// as before issue 33 — its job's actor here, or a forward
// to the owner (supervisor.Resolver). So a result whose owner is dead,
// restarted without the job in memory, slow, or running an older Troupe is
// handled exactly as before; only the forward goes away when the owner has
// it. A result handled twice (the owner later than the second read) is
// absorbed by the job's state like any duplicate.
//
// (A durable consumer per node on an interest-retention stream was tried
// first: nats-server 2.9 removed a result from the stream once one node's
// AckNone consumer had delivered it, before the shared consumer had; see
// NOTES.md.)
//
// Not used (the shared consumer alone, as before) when the node has no
// processed-message guard (the minimal configuration), or when it checks
// packet signatures (the owner's copy would be applied before the shared
// copy's verification and replay check).

// OwnConfirmFirst and OwnConfirmAgain are when the replica holding the
// shared copy of a result reads whether the owner handled it: first this
// long after taking it, then this much later. Both together stay well
// inside the shared consumer's first ack wait (bus.RedeliveryBackoff, 5 s).
const (
	OwnConfirmFirst = 250 * time.Millisecond
	OwnConfirmAgain = time.Second
)

// ownConfirmQueue bounds the shared copies waiting for their read (queued
// and held, each); past it a copy is handled at once, as before issue 33.
const ownConfirmQueue = 1 << 13

// ownConfirmBatch bounds the copies one read covers.
const ownConfirmBatch = 1024

// ownPending bounds the result messages the node's subscription holds
// unread; past it NATS drops them (the shared copies answer for them).
const ownPending = 1 << 13

// OwnResultCounts counts the shared consumer's copies of results by what
// became of them (label "how"): "owner" (the job's record showed it
// handled: acked unread), "handled" (handled as before issue 33).
type OwnResultCounts = *prometheus.CounterVec

// confirmer holds the shared copies of results until their job's record is
// read.
type confirmer struct {
	in      *Intake
	add     chan *confirmItem
	count   *prometheus.CounterVec
	settled settledSet
}

type confirmItem struct {
	msg    jetstream.Msg
	job    string
	key    settledKey
	status capv1.JobStatus
	taken  time.Time
	due    time.Time
	again  bool // read once already
	route  func()
}

// settledSet remembers, for ownSettledFor, the results this node's job
// actors settled from their own copies (ownDelivery.Ack: the result's
// handling is durable, or it was absorbed), so that the shared copy of a
// result that reaches its owner is acked without a read of the job's
// record (every shared copy, with one node).
//
// It also remembers the results heard here for a job whose actor is live
// here (heard): that actor will settle them, so their shared copies wait
// for it without a read (issue 33: under load the actor's terminal write
// lands after OwnConfirmFirst, and each such copy cost a read or two).
//
// It keeps one mark a job id (the attempt's: the map's string key takes
// the runtime's fast string path, where a struct key of two strings and a
// status was hashed by the generic one, ~3 % of node CPU with replicas,
// issue 33 round 9). The mark names its result (worker, status): a take
// for another result of the job finds nothing, and a mark for another
// result replaces it. A result whose mark was replaced is read from its
// job's record (or handled at once, when its job's actor is live here), as
// any result the set does not know: slower, never wrong. A job's results
// rarely overlap here (a retried attempt has its own id).
type settledSet struct {
	mu    sync.Mutex
	m     map[string]settledMark // by the result's job id
	swept time.Time
}

type settledMark struct {
	at     time.Time
	worker string
	status capv1.JobStatus
	done   bool // settled; else heard, passed to the job's live actor here
}

// is reports whether the mark is for the result k.
func (m *settledMark) is(k settledKey) bool {
	return m.worker == k.worker && m.status == k.status
}

// What the settled set knows of a result.
const (
	markNone    = iota // nothing
	markHeard          // heard, passed to its job's live actor here
	markSettled        // settled by its job's actor here (forgotten now)
)

// settledKey names a result: a worker repeating it sends the same key,
// and its job's actor makes the same of it.
type settledKey struct {
	job    string // the result's job id, attempt included
	worker string
	status capv1.JobStatus
}

func keyOf(res *capv1.JobResult) settledKey {
	return settledKey{job: res.JobId, worker: res.WorkerId, status: res.Status}
}

// ownSettledFor is how long a settled result is remembered: the shared
// copy reaches its holder within milliseconds, and a later one is read
// from the job's record.
const ownSettledFor = 5 * time.Second

func (s *settledSet) add(k settledKey) { s.mark(k, true) }

// heard remembers k passed to its job's live actor here (a settled or
// already heard k is left as it is).
func (s *settledSet) heard(k settledKey) { s.mark(k, false) }

func (s *settledSet) mark(k settledKey, done bool) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[string]settledMark)
	}
	if !done {
		// A settle always marks; a heard result only where its own mark
		// is not live.
		if m, ok := s.m[k.job]; ok && m.is(k) && (m.done || now.Sub(m.at) <= ownSettledFor) {
			return
		}
	}
	s.m[k.job] = settledMark{at: now, worker: k.worker, status: k.status, done: done}
	if now.Sub(s.swept) > ownSettledFor {
		for job, m := range s.m {
			if now.Sub(m.at) > ownSettledFor {
				delete(s.m, job)
			}
		}
		s.swept = now
	}
}

// take reports whether k was settled here (and forgets it), or heard.
func (s *settledSet) take(k settledKey) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.m[k.job]
	switch {
	case !ok || !m.is(k):
		return markNone
	case m.done:
		delete(s.m, k.job)
		return markSettled
	}
	return markHeard
}

// startOwnResults starts the confirmer and subscribes this node to the
// result subject unless it is alone (SetPeers); false (and nothing started)
// where the shared consumer alone must be used.
func (in *Intake) startOwnResults(ctx context.Context, nc *nats.Conn) bool {
	if nc == nil || in.Guard == nil || in.Store == nil || (in.Signatures != nil && in.Signatures.Verifier != nil) {
		return false
	}
	c := &confirmer{in: in, add: make(chan *confirmItem, ownConfirmQueue), count: in.OwnResults}
	in.confirm = c // before the subscription's handler reads it
	in.own.mu.Lock()
	in.own.nc, in.own.ctx = nc, ctx
	in.own.mu.Unlock()
	if err := in.own.apply(in); err != nil {
		in.Log.Warn("result subject not subscribed: results reach their owners by forwards", "err", err)
	}
	go func() {
		<-ctx.Done()
		in.own.mu.Lock()
		defer in.own.mu.Unlock()
		in.own.unsubscribe()
	}()
	go c.loop(ctx)
	return true
}

// A node alone hears no result subject (issue 33). Its own copy exists so
// that each result reaches its job's owner without a forward when several
// replicas share the result stream's consumer; a node with no replica
// receives every shared copy itself, and hearing each result a second time
// only cost it a decode, a settled-set entry and a NATS delivery per job
// (0.8 NATS messages and ~5 % of the node's CPU per job). So the node
// subscribes while its router knows another replica (router.Config.OnPeers
// → SetPeers) and unsubscribes when the last one is forgotten (silent for
// router.PeerTTL). Before the router first reports (or without gossip), it
// subscribes. Either way is correct: the heard copy is only a fast path,
// and the shared copy answers for every result; in the moments after a
// replica appears and before both hear the subject, a result reaches its
// owner by a forward, as before issue 33.
type ownSubscription struct {
	mu         sync.Mutex
	nc         *nats.Conn
	ctx        context.Context
	sub        *nats.Subscription
	peersKnown bool
	peers      int
	stopped    bool
	// on: subscribed (HandleResult holds the shared copies for the
	// owner's settle); offAt: when it last unsubscribed (unix ns), for the
	// copies of results heard and settled just before.
	on    atomic.Bool
	offAt atomic.Int64
}

// SetPeers tells the intake how many other replicas the node knows: with
// none it stops hearing the result subject, with one or more it hears it.
func (in *Intake) SetPeers(n int) {
	in.own.mu.Lock()
	in.own.peersKnown, in.own.peers = true, n
	in.own.mu.Unlock()
	if err := in.own.apply(in); err != nil {
		in.Log.Warn("result subject not subscribed: results reach their owners by forwards", "err", err)
	}
}

// apply subscribes or unsubscribes as the known peers ask, once started.
func (o *ownSubscription) apply(in *Intake) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.nc == nil || o.stopped || o.ctx.Err() != nil {
		return nil
	}
	want := !o.peersKnown || o.peers > 0
	if want == (o.sub != nil) {
		return nil
	}
	if !want {
		o.unsubscribe()
		return nil
	}
	sub, err := o.nc.Subscribe(in.Env.Subjects.Result, in.HandleOwnResult)
	if err != nil {
		return err
	}
	_ = sub.SetPendingLimits(ownPending, ownPending*1024)
	o.sub = sub
	o.on.Store(true)
	return nil
}

// unsubscribe drops the subscription (o.mu held).
func (o *ownSubscription) unsubscribe() {
	if o.ctx != nil && o.ctx.Err() != nil {
		o.stopped = true
	}
	if o.sub == nil {
		return
	}
	o.on.Store(false)
	o.offAt.Store(time.Now().UnixNano())
	_ = o.sub.Unsubscribe()
	o.sub = nil
}

// offRecently reports whether the subscription was dropped within
// ownSettledFor: results heard and settled before may still have shared
// copies to ack unread.
func (o *ownSubscription) offRecently() bool {
	at := o.offAt.Load()
	return at != 0 && time.Since(time.Unix(0, at)) <= ownSettledFor
}

// Hearing reports whether the node hears the result subject now.
func (in *Intake) Hearing() bool { return in.own.on.Load() }

// HandleOwnResult handles one result heard on the result subject: a result
// for a job with a live actor here goes to that actor, with a delivery
// that settles nothing; anything else is dropped (the shared consumer's
// copy answers for it), a job parked here included: the shard does not
// wake a parked job for a heard result, as the workers' answers to a
// million parked jobs, heard at once, started an actor for each (8.3 GB of
// node RSS and 1,285 job locks lost in a 1,000,000-job hold's release).
// Every result heard while the admission gate holds the result stream's
// fetches (the node's renewals or writes are behind) or the node holds
// MaxLiveLocks live locks is dropped too; the shared copies come in at the
// rate the gate lets through.
func (in *Intake) HandleOwnResult(msg *nats.Msg) {
	if len(msg.Data) > MaxPacketBytes {
		return
	}
	if id, ok := bus.PeekResultJobID(msg.Data); ok && !in.holdsID(id) {
		// Another replica's job, or one with no live actor here (parked,
		// ended): its shared copy answers for it, and the router frees
		// the worker's slot when that copy is handled. With N replicas,
		// (N-1)/N of the heard results end here, before a decode — and
		// before ownHeld, whose renewal check reads the clock (issue 33,
		// round 12): dropped either way.
		return
	}
	if in.ownHeld() {
		return
	}
	pkt, err := bus.Decode(msg.Data)
	if err != nil {
		return
	}
	res := pkt.GetJobResult()
	if res == nil || res.WorkerId == "" || ValidateEventJobID(res.JobId) != nil {
		// Outcomes told by nodes and anything malformed: the shared
		// copy's, which dead-letters what must be.
		return
	}
	job := JobOf(res.JobId)
	if in.holds(job) {
		in.confirm.settled.heard(keyOf(res))
	}
	// One block, as intake's resultEvent: the envelope, the event, its
	// delivery and the router's message.
	ev := &ownEvent{od: ownDelivery{set: &in.confirm.settled, key: keyOf(res)}}
	if terminalStatus(res.Status) {
		// As HandleResult: the worker's slot is free (a router that does
		// not count the job on that worker ignores it).
		ev.rel = router.Released{WorkerID: res.WorkerId, JobID: job, Done: true}
		in.Env.Root.Send(in.Env.Router, &ev.rel)
	}
	ev.r = jobactor.Result{Res: res, TraceID: pkt.TraceId, Delivery: &ev.od, Raw: msg.Data, Heard: true, Refuse: ownRefuse}
	ev.d = supervisor.Deliver{JobID: job, Msg: &ev.r}
	in.send(&ev.d)
}

type ownEvent struct {
	d   supervisor.Deliver
	r   jobactor.Result
	od  ownDelivery
	rel router.Released
}

// ownHeld reports whether heard results are dropped now: the admission
// gate holds the result stream's fetches, or the node holds MaxLiveLocks
// live locks.
func (in *Intake) ownHeld() bool {
	return in.behind() || in.Env != nil && in.Env.Renewer != nil && in.Env.Renewer.Held() >= MaxLiveLocks
}

// holds reports whether job's actor is live here (this node holds its
// lock).
func (in *Intake) holds(job string) bool {
	return in.Env != nil && in.Env.Renewer != nil && in.Env.Renewer.Holds(job)
}

// holdsID is holds for a job id read in place (bus.PeekResultJobID): the
// string made over id lives only for the lookup.
func (in *Intake) holdsID(id []byte) bool {
	return in.holds(JobOf(unsafe.String(unsafe.SliceData(id), len(id))))
}

// ownRefuse leaves a refused own copy unsettled: the shared copy, finding
// the job not moved, is handled (and refused, with its record) as before.
func ownRefuse(jobstate.Reason, string) {}

// ownDelivery settles an own copy of a result: its ack remembers the
// result settled, for the shared copy if it reaches this node; there is
// nothing else to settle (elsewhere, the job's record is what the shared
// copy's holder reads).
type ownDelivery struct {
	set *settledSet
	key settledKey
}

func (d ownDelivery) Ack() error                     { d.set.add(d.key); return nil }
func (ownDelivery) NakWithDelay(time.Duration) error { return nil }
func (ownDelivery) InProgress() error                { return nil }

// handledBy reports whether a job in state st shows a result of status
// status handled: a terminal job that ended as such a result ends it (a
// running one, for a progress report; a terminal one, for a progress
// report too). A terminal job that ended otherwise — cancelled, timed out, or a retried attempt's failure heard
// after the job succeeded — absorbs the result as a late one: that copy
// is handled as before issue 33, so the absorption is counted
// (troupe_duplicates_absorbed_total) and a stale attempt's result is told
// apart by the job's actor.
func handledBy(st jobstate.State, status capv1.JobStatus) bool {
	if st.Terminal() {
		return endedAs(st, status)
	}
	return !terminalStatus(status) && st == jobstate.StateRunning
}

// endedAs reports whether a job that ended in st may have been ended by a
// worker's result of status.
func endedAs(st jobstate.State, status capv1.JobStatus) bool {
	if !terminalStatus(status) {
		return true // a progress report: nothing to a job that ended
	}
	switch status {
	case capv1.JobStatus_JOB_STATUS_SUCCEEDED:
		return st == jobstate.StateSucceeded || st == jobstate.StateOutputQuarantined
	case capv1.JobStatus_JOB_STATUS_FAILED, capv1.JobStatus_JOB_STATUS_FAILED_FATAL:
		return st == jobstate.StateFailed
	case capv1.JobStatus_JOB_STATUS_TIMEOUT:
		return st == jobstate.StateTimeout
	case capv1.JobStatus_JOB_STATUS_CANCELLED:
		return st == jobstate.StateCancelled
	case capv1.JobStatus_JOB_STATUS_DENIED:
		return st == jobstate.StateDenied
	}
	return false
}

// hold queues the shared copy msg of res for its read; route handles it as
// before issue 33. Past the queue's bound route runs at once.
func (c *confirmer) hold(msg jetstream.Msg, res *capv1.JobResult, route func()) {
	key := keyOf(res)
	if c.settled.take(key) == markSettled {
		c.counted("owner")
		_ = msg.Ack()
		return
	}
	now := time.Now()
	select {
	case c.add <- &confirmItem{msg: msg, job: JobOf(res.JobId), key: key, status: res.Status,
		taken: now, due: now.Add(OwnConfirmFirst), route: route}:
	default:
		route()
	}
}

func (c *confirmer) loop(ctx context.Context) {
	var first, again []*confirmItem // each in due order
	// A timer runs only while copies wait (an idle node wakes for
	// nothing); it fires at the earliest head's due time, and a question
	// takes every copy due within ownConfirmCoalesce of it, so that at any
	// rate copies are asked for in batches.
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	for {
		if !armed && (len(first) > 0 || len(again) > 0) {
			next := time.Time{}
			if len(first) > 0 {
				next = first[0].due
			}
			if len(again) > 0 && (next.IsZero() || again[0].due.Before(next)) {
				next = again[0].due
			}
			timer.Reset(max(time.Until(next), 0))
			armed = true
		}
		// Past ownConfirmQueue waiting here the loop stops taking copies:
		// the channel fills and hold routes the next ones at once.
		add := c.add
		if len(first)+len(again) >= ownConfirmQueue {
			add = nil
		}
		select {
		case <-ctx.Done():
			// The fetch loops have stopped: what waits is left unacked,
			// and JetStream offers it again (to a replica, if this node
			// is stopping).
			timer.Stop()
			return
		case it := <-add:
			first = append(first, it)
			continue
		case <-timer.C:
			armed = false
		}
		now := time.Now()
		horizon := now.Add(ownConfirmCoalesce)
		var due []*confirmItem
		for len(due) < ownConfirmBatch && len(again) > 0 && !again[0].due.After(horizon) {
			due, again = append(due, again[0]), again[1:]
		}
		for len(due) < ownConfirmBatch && len(first) > 0 && !first[0].due.After(horizon) {
			due, first = append(due, first[0]), first[1:]
		}
		if len(due) == 0 {
			continue
		}
		again, first = c.ask(due, now, again, first)
		first = compact(first)
		again = compact(again)
	}
}

// ownConfirmCoalesce: a question also takes the copies due this soon.
const ownConfirmCoalesce = 50 * time.Millisecond

// ownLiveWait bounds how long a shared copy waits, unread, for its job's
// live actor here to settle the result it heard (then it is handled as
// before issue 33, by that actor): well inside the shared consumer's first
// ack wait (bus.RedeliveryBackoff, 5 s).
const ownLiveWait = 2 * time.Second

// ask acks the copies of due settled here meanwhile, leaves waiting those
// whose job's actor here heard their result, handles at once those of the
// other jobs live here (their actor did not hear the result: the
// subscription dropped it), and reads the records of the others' jobs:
// acks the copies their job shows handled, queues the others read once
// for again, handles the rest.
//
// Waiting copies go back to first, due OwnConfirmFirst from now (after
// every copy there; about as early as any copy still to come).
func (c *confirmer) ask(due []*confirmItem, now time.Time, again, first []*confirmItem) ([]*confirmItem, []*confirmItem) {
	kept := due[:0]
	for _, it := range due {
		mark := c.settled.take(it.key)
		if mark == markSettled {
			c.counted("owner")
			_ = it.msg.Ack()
			continue
		}
		if c.in.holds(it.job) {
			if mark == markHeard && now.Sub(it.taken) < ownLiveWait {
				// Its actor here will settle it: no read.
				it.due = now.Add(OwnConfirmFirst)
				first = append(first, it)
				continue
			}
			c.counted("handled")
			it.route()
			continue
		}
		kept = append(kept, it)
	}
	due = kept
	if len(due) == 0 {
		return again, first
	}
	ids := make([]string, len(due))
	for i, it := range due {
		ids[i] = it.job
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	states, err := c.in.Store.States(ctx, ids)
	cancel()
	for _, it := range due {
		st, ok := states[it.job]
		switch {
		case err == nil && ok && handledBy(st, it.status):
			c.counted("owner")
			_ = it.msg.Ack()
		case err == nil && !it.again:
			it.again, it.due = true, now.Add(OwnConfirmAgain)
			again = append(again, it)
		default:
			c.counted("handled")
			it.route()
		}
	}
	return again, first
}

func (c *confirmer) counted(how string) {
	if c.count != nil {
		c.count.WithLabelValues(how).Inc()
	}
}

// compact copies a queue that has moved far into its backing array.
func compact(q []*confirmItem) []*confirmItem {
	if cap(q) > 4096 && len(q) < cap(q)/4 {
		return append(make([]*confirmItem, 0, 2*len(q)), q...)
	}
	return q
}
