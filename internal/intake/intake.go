package intake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/logx"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/signing"
)

// Intake turns bus messages into actor messages. It runs on the JetStream
// fetch goroutines and the core NATS subscription goroutines; it decodes,
// validates, and routes each message to the job's shard. Bad input never goes
// further: it is logged with its reason, written to the DLQ, and acked, so it
// is not redelivered forever and blocks nothing behind it.
type Intake struct {
	Env    *jobactor.Env
	Store  *store.Store
	Shards []*actor.PID
	Log    *slog.Logger
	// Signatures checks packet signatures first (nil: not checked).
	Signatures *Signatures
	// Guard, when set, skips redelivered messages that were handled but
	// not acked, and marks every handled message before its ack.
	Guard *Guard
	// OwnOutcomes, when set, counts this node's own told outcomes read
	// back from the result stream and skipped.
	OwnOutcomes prometheus.Counter
	// DLQFailures, when set, counts bad inputs whose DLQ entry could not
	// be written, by reason (label "reason").
	DLQFailures *prometheus.CounterVec
	// HeartbeatsRefused, when set, counts heartbeats refused by
	// ValidateHeartbeat (the registry counts those refused by its bounds).
	HeartbeatsRefused prometheus.Counter
	// SubmitRoom, when set, is how many more submits the node should take
	// now (its admission bounds less what it holds): each submit fetch asks
	// for no more (see Consume).
	SubmitRoom func() int
	// SubmitKeep, when > 0, has the submit stream's fetch loops keep each
	// fetched submit in progress at JetStream until it is settled, for at
	// most this long from its fetch (bus.KeepInProgress): a backlog in the
	// node past the consumer's redelivery wait does not have JetStream
	// offer its submits again. SubmitTouches, when set, counts the
	// in-progress signals that sent.
	SubmitKeep    time.Duration
	SubmitTouches *atomic.Uint64
	// SubmitsRedelivered, when set, counts submits taken on a second or
	// later delivery (a node died holding them, or held them past the
	// consumer's redelivery wait).
	SubmitsRedelivered prometheus.Counter
	// BatchSettle bounds how long the inbox waits for the items of a
	// forwarded batch to be settled before it answers (0:
	// BatchSettleDefault).
	BatchSettle time.Duration

	// FindWaiting, when set, names the node — this one or a replica — on
	// which jobID waits for room, or "" (Node.WaitingJob). A cancel is
	// passed to that node first (see HandleCancel). It may block up to a
	// second or so.
	FindWaiting func(ctx context.Context, jobID string) string
	// findSlots bounds the lookups in flight (cancelLookups): past it a
	// cancel is routed here at once, as without FindWaiting.
	findSlots chan struct{}
	findOnce  sync.Once

	// draining: the node is stopping its job actors; forwarded events are
	// refused at once (see Drain).
	draining atomic.Bool

	// Delay, when set, holds submits that ask to run later (delay.go).
	Delay DelayHook

	// OwnResults, when set, counts the shared consumer's copies of results
	// by what became of them (own.go).
	OwnResults OwnResultCounts
	// confirm, once the node hears the result subject itself, holds the
	// shared consumer's copies until their job's record is read.
	confirm *confirmer
	// own is the result subject's subscription, made only while other
	// replicas are known (SetPeers, own.go).
	own ownSubscription
	// CancelDelayed, when set, removes a delayed job not yet due that a
	// cancel with no record names (delay.go).
	CancelDelayed CancelDelayedHook
}

// Drain makes the node's inbox refuse every forwarded event from now on,
// answering at once: the node is stopping its actors, which release their
// locks, and the sender offers the event again a second later (by then to
// itself, the lock gone). The inbox stays subscribed meanwhile, so a sender
// never hears "no responders" from an owner whose locks are still held —
// which would make it wait for the owner's node lease to go stale.
func (in *Intake) Drain() { in.draining.Store(true) }

func (in *Intake) route(jobID string, msg interface{}, spawn bool) {
	in.send(&supervisor.Deliver{JobID: jobID, Msg: msg, Spawn: spawn})
}

// send hands d to its job's shard.
func (in *Intake) send(d *supervisor.Deliver) {
	in.Env.Root.Send(in.Shards[supervisor.ShardFor(d.JobID, len(in.Shards))], d)
}

// A stream message's event for its job actor is allocated as one block
// with the shard's envelope and the guarded delivery (three allocations
// were one each on every submit and result). The block lives as long as
// its longest-held part, the event: the envelope's few words longer than before.
type (
	submitEvent struct {
		d supervisor.Deliver
		s jobactor.Submit
		g GuardedMsg
	}
	resultEvent struct {
		d   supervisor.Deliver
		r   jobactor.Result
		g   GuardedMsg
		rel router.Released // the router's, for a worker's final answer
	}
)

// lastOffer dead-letters a message on its last delivery: JetStream drops
// it after that, and nothing is dropped unrecorded. It reports whether it did.
func (in *Intake) lastOffer(msg jetstream.Msg) bool {
	md, err := msg.Metadata()
	if err != nil || md.NumDelivered < bus.MaxDeliverDefault {
		return false
	}
	in.reject(msg, "", "", jobstate.ReasonMaxDeliveries,
		fmt.Sprintf("offered %d times and never handled", md.NumDelivered))
	return true
}

// metaMsg is a JetStream message whose metadata (parsed from its reply
// subject, which allocates) was read once: intake reads it up to four times
// per message (its delivery count, its guard key, when it was stored, and
// again at its ack).
type metaMsg struct {
	jetstream.Msg
	md  *jetstream.MsgMetadata
	err error
}

func withMetadata(msg jetstream.Msg) jetstream.Msg {
	if _, ok := msg.(interface{ MetadataParsed() }); ok {
		return msg // bus's pulled messages parse theirs as they arrive
	}
	md, err := msg.Metadata()
	return &metaMsg{Msg: msg, md: md, err: err}
}

func (m *metaMsg) Metadata() (*jetstream.MsgMetadata, error) { return m.md, m.err }

// publishedAt is when msg entered its stream (zero if unknown).
func publishedAt(msg jetstream.Msg) time.Time {
	if md, err := msg.Metadata(); err == nil {
		return md.Timestamp
	}
	return time.Time{}
}

// take decodes a stream message and checks that it carries the payload its
// stream is for (payload returns the packet's job id and whether it does)
// and that validate accepts it. Anything else is dead-lettered with its
// reason and acked; take then reports false.
func (in *Intake) take(msg jetstream.Msg, stream, want string, payload func(*capv1.BusPacket) (string, bool),
	validate func(*capv1.BusPacket) error) (*capv1.BusPacket, *signing.Principal, bool) {
	if in.lastOffer(msg) {
		return nil, nil, false
	}
	if in.Guard != nil && in.Guard.Seen(msg) {
		_ = msg.Ack()
		return nil, nil, false
	}
	if n := len(msg.Data()); n > MaxPacketBytes {
		in.reject(msg, "", "", jobstate.ReasonInvalidRequest,
			fmt.Sprintf("%s packet of %d bytes exceeds the %d-byte limit", stream, n, MaxPacketBytes))
		return nil, nil, false
	}
	pkt, err := bus.Decode(msg.Data())
	if err != nil {
		in.reject(msg, "", "", jobstate.ReasonDecodeFailed, "packet does not decode: "+err.Error())
		return nil, nil, false
	}
	by, ok := in.verified(msg, stream, pkt)
	if !ok {
		return nil, nil, false
	}
	jobID, ok := payload(pkt)
	if !ok {
		in.reject(msg, "", pkt.TraceId, jobstate.ReasonUnexpectedKind,
			fmt.Sprintf("%s subject carries %s, not a %s", stream, payloadKind(pkt), want))
		return nil, nil, false
	}
	if err := validate(pkt); err != nil {
		in.reject(msg, jobID, pkt.TraceId, jobstate.ReasonInvalidRequest, stream+": "+err.Error())
		return nil, nil, false
	}
	return pkt, by, true
}

// delivery is how a job actor settles msg: through the guard when there is one.
func (in *Intake) delivery(msg jetstream.Msg) jobactor.Delivery {
	if in.Guard != nil {
		return in.Guard.Wrap(msg)
	}
	return msg
}

// deliveryIn is delivery with the guard's wrapper in g, allocated by the caller.
func (in *Intake) deliveryIn(msg jetstream.Msg, g *GuardedMsg) jobactor.Delivery {
	if in.Guard != nil {
		*g = GuardedMsg{Msg: msg, g: in.Guard, kept: keptInProgress(msg)}
		return g
	}
	return msg
}

// HandleSubmit handles one message from the submit stream.
func (in *Intake) HandleSubmit(msg jetstream.Msg) {
	msg = withMetadata(msg)
	if in.SubmitsRedelivered != nil {
		if md, err := msg.Metadata(); err == nil && md.NumDelivered > 1 {
			in.SubmitsRedelivered.Inc()
		}
	}
	pkt, _, ok := in.take(msg, KindSubmit, "job_request",
		func(p *capv1.BusPacket) (string, bool) { r := p.GetJobRequest(); return r.GetJobId(), r != nil },
		func(p *capv1.BusPacket) error { return ValidateRequest(p.GetJobRequest()) })
	if !ok {
		return
	}
	req := pkt.GetJobRequest()
	trace := pkt.TraceId
	if trace == "" {
		trace = req.JobId
	}
	if in.divert(msg, req, trace) {
		return
	}
	ev := &submitEvent{}
	ev.s = jobactor.Submit{Req: req, TraceID: trace, Delivery: in.deliveryIn(msg, &ev.g), Published: publishedAt(msg)}
	ev.d = supervisor.Deliver{JobID: req.JobId, Msg: &ev.s, Spawn: true}
	in.send(&ev.d)
}

// HandleResult handles one message from the result stream.
func (in *Intake) HandleResult(msg jetstream.Msg) {
	msg = withMetadata(msg)
	pkt, by, ok := in.take(msg, KindResult, "job_result",
		func(p *capv1.BusPacket) (string, bool) { r := p.GetJobResult(); return r.GetJobId(), r != nil },
		func(p *capv1.BusPacket) error { return ValidateEventJobID(p.GetJobResult().GetJobId()) })
	if !ok {
		return
	}
	res := pkt.GetJobResult()
	if res.WorkerId == "" && (by == nil || by.Is(signing.RoleNode)) &&
		(pkt.SenderId == in.Env.NodeID || res.ErrorCode == string(jobstate.ReasonStateLost)) {
		// An outcome this node decided and told the job's client: the job
		// is terminal already; reading it back would only cost an
		// activation to absorb it. A state_lost outcome, told by any
		// replica, is for a job with no record: taken as an event, it would
		// be dead-lettered and told again, without end.
		if in.OwnOutcomes != nil {
			in.OwnOutcomes.Inc()
		}
		_ = msg.Ack()
		return
	}
	if in.confirm != nil && res.WorkerId != "" {
		if in.own.on.Load() {
			// The job's owner hears its own copy (own.go): this one is
			// acked once the job's record shows it handled, handled
			// otherwise.
			in.confirm.hold(msg, res, func() { in.routeResult(msg, pkt, res, by) })
			return
		}
		if in.own.offRecently() && in.confirm.settled.take(keyOf(res)) == markSettled {
			// Heard and settled here just before the node stopped hearing
			// the result subject.
			in.confirm.counted("owner")
			_ = msg.Ack()
			return
		}
	}
	// Called, not bound into a func: the closure above is made only for a
	// copy the confirmer holds (one allocation a result, issue 33 round 12).
	in.routeResult(msg, pkt, res, by)
}

// routeResult hands a result to its job's actor (and, for a worker's
// final answer, frees the worker's slot at the router first).
func (in *Intake) routeResult(msg jetstream.Msg, pkt *capv1.BusPacket, res *capv1.JobResult, by *signing.Principal) {
	ev := &resultEvent{}
	if res.WorkerId != "" && terminalStatus(res.Status) {
		// The worker has answered: its slot is free now, before the
		// job's actor has written the outcome (the router ignores a job
		// it does not count on that worker).
		ev.rel = router.Released{WorkerID: res.WorkerId, JobID: JobOf(res.JobId), Done: true}
		in.Env.Root.Send(in.Env.Router, &ev.rel)
	}
	ev.r = jobactor.Result{Res: res, TraceID: pkt.TraceId, Delivery: in.deliveryIn(msg, &ev.g), Raw: msg.Data(),
		Published: publishedAt(msg), By: jobactor.By(by), Refuse: in.refuser(msg, KindResult, pkt)}
	ev.d = supervisor.Deliver{JobID: JobOf(res.JobId), Msg: &ev.r, Spawn: true}
	in.send(&ev.d)
}

// terminalStatus reports whether a result status ends the worker's run.
func terminalStatus(s capv1.JobStatus) bool {
	switch s {
	case capv1.JobStatus_JOB_STATUS_SUCCEEDED, capv1.JobStatus_JOB_STATUS_FAILED,
		capv1.JobStatus_JOB_STATUS_FAILED_FATAL, capv1.JobStatus_JOB_STATUS_CANCELLED,
		capv1.JobStatus_JOB_STATUS_TIMEOUT, capv1.JobStatus_JOB_STATUS_DENIED:
		return true
	}
	return false
}

// HandleProgress handles a core NATS progress message. Progress is advisory:
// only a job actor live on this node acts on it, and bad packets are dropped
// with a log line (there is nothing to ack or redeliver).
func (in *Intake) HandleProgress(msg *nats.Msg) {
	pkt, err := bus.Decode(msg.Data)
	if err != nil || pkt.GetJobProgress() == nil || ValidateEventJobID(pkt.GetJobProgress().GetJobId()) != nil {
		in.Log.Debug("progress packet ignored", "subject", msg.Subject, "err", err)
		return
	}
	by, err := in.Signatures.principal(KindProgress, pkt, msg.Data)
	if err != nil {
		in.Log.Debug("progress packet rejected", "subject", msg.Subject, "err", err)
		return
	}
	if by != nil {
		reason, detail := jobstate.Reason(""), ""
		if !by.Is(signing.RoleWorker) {
			reason, detail = jobstate.ReasonForbiddenRole, "a progress from "+by.String()
		} else {
			reason, detail = in.Signatures.fresh(pkt, time.Time{}, 0, false)
		}
		if reason != "" {
			in.Signatures.count(KindProgress, refusalLabel(reason))
			in.Log.Debug("progress packet refused", "subject", msg.Subject, "reason", reason, "detail", detail)
			return
		}
	}
	p := pkt.GetJobProgress()
	refuse := func(reason jobstate.Reason, detail string) {
		in.Signatures.count(KindProgress, refusalLabel(reason))
		in.Log.Debug("progress packet refused", "job_id", p.JobId, "reason", reason, "detail", detail)
	}
	in.route(JobOf(p.JobId), &jobactor.Progress{P: p, From: pkt.SenderId, By: jobactor.By(by), Refuse: refuse}, false)
}

// HandleHeartbeat handles a core NATS heartbeat.
func (in *Intake) HandleHeartbeat(msg *nats.Msg) {
	pkt, err := bus.Decode(msg.Data)
	if err != nil || pkt.GetHeartbeat() == nil {
		in.Log.Warn("heartbeat packet ignored", "subject", msg.Subject, "err", err)
		return
	}
	by, err := in.Signatures.principal(KindHeartbeat, pkt, msg.Data)
	if err != nil {
		in.Log.Warn("heartbeat rejected", "subject", msg.Subject, "err", err)
		return
	}
	hb := pkt.GetHeartbeat()
	if by != nil {
		reason, detail := in.Signatures.mayHeartbeat(by, hb)
		if reason == "" {
			reason, detail = in.Signatures.fresh(pkt, time.Time{}, 0, false)
		}
		if reason != "" {
			in.Signatures.count(KindHeartbeat, refusalLabel(reason))
			in.Log.Warn("heartbeat refused", "reason", reason, "detail", logx.Clip(detail))
			return
		}
	}
	if err := ValidateHeartbeat(hb); err != nil {
		if in.HeartbeatsRefused != nil {
			in.HeartbeatsRefused.Inc()
		}
		in.Log.Warn("heartbeat ignored", "worker_id", logx.Clip(hb.WorkerId), "pool", logx.Clip(hb.Pool), "err", err)
		return
	}
	seen := &router.HeartbeatSeen{HB: hb, At: time.Now()}
	if ts := pkt.GetCreatedAt(); ts != nil && ts.IsValid() {
		seen.Sent = ts.AsTime()
	}
	in.Env.Root.Send(in.Env.Router, seen)
}

// reject dead-letters a message that can never be processed, then acks it
// (terms it when the DLQ cannot take it).
func (in *Intake) reject(msg jetstream.Msg, jobID, traceID string, reason jobstate.Reason, detail string) {
	jobID, traceID, detail = logx.Clip(jobID), logx.Clip(traceID), logx.Clip(detail)
	in.Log.Warn("bad input rejected", "subject", msg.Subject(), "job_id", jobID, "trace_id", traceID,
		"reason", reason, "detail", detail)
	entry := &store.DLQEntry{JobID: jobID, Reason: reason, Message: detail, Subject: msg.Subject(),
		TraceID: traceID, Raw: msg.Data()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := in.Store.AddDLQ(ctx, entry); err != nil {
		// Bad input is never offered again for the DLQ's sake: a flood of
		// it, with Redis out of memory or away, would come back twenty
		// times each and compete with the jobs for Redis. This line (with
		// the packet's size and hash) and the counter are its record.
		sum := sha256.Sum256(msg.Data())
		in.Log.Error("dlq write failed; bad input dropped", "subject", msg.Subject(), "job_id", jobID,
			"reason", reason, "bytes", len(msg.Data()), "sha256", hex.EncodeToString(sum[:]), "err", err)
		if in.DLQFailures != nil {
			in.DLQFailures.WithLabelValues(string(reason)).Inc()
		}
		jobactor.PublishDLQ(in.Env, entry)
		_ = msg.Term()
		return
	}
	jobactor.PublishDLQ(in.Env, entry)
	// Through the guard, like any handled message: if this ack is lost and
	// JetStream offers the packet again, it is acked unhandled rather than
	// dead-lettered a second time.
	_ = in.delivery(msg).Ack()
}

func payloadKind(p *capv1.BusPacket) string {
	switch p.Payload.(type) {
	case *capv1.BusPacket_JobRequest:
		return "job_request"
	case *capv1.BusPacket_JobResult:
		return "job_result"
	case *capv1.BusPacket_Heartbeat:
		return "heartbeat"
	case *capv1.BusPacket_Alert:
		return "alert"
	case *capv1.BusPacket_JobProgress:
		return "job_progress"
	case *capv1.BusPacket_JobCancel:
		return "job_cancel"
	}
	return "an empty payload"
}

// HandleCancel handles one message from the cancel stream.
func (in *Intake) HandleCancel(msg jetstream.Msg) {
	msg = withMetadata(msg)
	pkt, by, ok := in.take(msg, KindCancel, "job_cancel",
		func(p *capv1.BusPacket) (string, bool) { c := p.GetJobCancel(); return c.GetJobId(), c != nil },
		func(p *capv1.BusPacket) error { return ValidateJobID(p.GetJobCancel().GetJobId()) })
	if !ok {
		return
	}
	cn := pkt.GetJobCancel()
	c := &jobactor.Cancel{C: cn, TraceID: pkt.TraceId, Delivery: in.delivery(msg), Raw: msg.Data(),
		Published: publishedAt(msg), By: jobactor.By(by), Refuse: in.refuser(msg, KindCancel, pkt)}
	if in.FindWaiting == nil || in.Env.Forward == nil || !in.takeFindSlot() {
		in.route(cn.JobId, c, true)
		return
	}
	go func() { // asks the replicas: off the fetch loop
		defer func() { <-in.findSlots }()
		in.cancelWaiting(cn.JobId, c)
	}()
}

// cancelLookups bounds the cancels whose waiting node is being looked up
// at once: a flood of cancels costs at most this many goroutines and
// requests in flight; the rest go the usual way (their actor, then the
// job's owner, or a hold while the job has no record).
const cancelLookups = 256

func (in *Intake) takeFindSlot() bool {
	in.findOnce.Do(func() { in.findSlots = make(chan struct{}, cancelLookups) })
	select {
	case in.findSlots <- struct{}{}:
		return true
	default:
		return false
	}
}

// cancelWaitingBudget bounds the search for the node on which a cancelled
// job waits (askPeers waits a second for the replicas' answers).
const cancelWaitingBudget = 2 * time.Second

// cancelWaiting hands a cancel to the replica on which its job waits for
// room, when that is not this node. A job waiting within its capacity
// grace has no record (its submit is held in the stream), so this node's
// actor would find nothing and hold the cancel, then dead-letter it
// unknown_job, while the job is placed later and runs. Anywhere else the
// cancel is routed here as usual: to the job waiting on this node, or to
// an actor that reads the job's record (and forwards the cancel to the
// job's owner).
func (in *Intake) cancelWaiting(jobID string, c *jobactor.Cancel) {
	ctx, cancel := context.WithTimeout(context.Background(), cancelWaitingBudget)
	node := in.FindWaiting(ctx, jobID)
	cancel()
	if node != "" && node != in.Env.NodeID {
		if err := in.Env.Forward(node, jobactor.ForwardCancel, c.Raw); err == nil {
			in.Env.Metrics.Forwarded.WithLabelValues("taken").Inc()
			_ = c.Delivery.Ack()
			return
		}
		in.Log.Info("cancel of a job waiting on a replica not taken there; handled here", "job_id", jobID,
			"trace_id", c.TraceID, "node", node)
	}
	if node == "" && in.markHeld(jobID, c) {
		return
	}
	in.route(jobID, c, true)
}

// Tell delivers msg to the job's actor if it is live on this node.
func (in *Intake) Tell(jobID string, msg interface{}) { in.route(jobID, msg, false) }

// Wake asks the job's actor (spawning it) to activate the job.
func (in *Intake) Wake(jobID string) { in.route(jobID, &jobactor.Wake{}, true) }

// WakeLost wakes a job this node left waiting alone, Redis having lost
// its data: one with no record ends state_lost (lifecycle.Wake.Lost).
func (in *Intake) WakeLost(jobID string) { in.route(jobID, &jobactor.Wake{Lost: true}, true) }

// WakeOrphan wakes a job whose owner's lock lapsed at lapsedAt (its lease
// ran out), so the adoption latency can be measured.
func (in *Intake) WakeOrphan(jobID string, lapsedAt time.Time) {
	in.route(jobID, &jobactor.Wake{LapsedAt: lapsedAt}, true)
}

// RememberParked hands each job id to its shard's memory of parked
// DISPATCHED jobs (see supervisor.JobShard).
func (in *Intake) RememberParked(jobIDs []string) {
	byShard := map[int][]string{}
	for _, id := range jobIDs {
		i := supervisor.ShardFor(id, len(in.Shards))
		byShard[i] = append(byShard[i], id)
	}
	for i, ids := range byShard {
		in.Env.Root.Send(in.Shards[i], &supervisor.RememberParked{JobIDs: ids})
	}
}
