package intake

import (
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
)

// The forwarding inbox. A job actor given a result or cancel for a job that
// another node owns forwards it (Forwarder: a NATS request on the owner's
// inbox subject); the JetStream message is acked only once the owner
// answers that it took the event, and handed back otherwise. HandleInbox is
// the owner's side: it checks the packet and hands it to the job's shard.
// A Resolver forwards several events to one owner in one request instead
// (inbox_batch.go); every node still takes this single form.

// HeaderKind names what a forwarded packet is (jobactor.ForwardResult or
// jobactor.ForwardCancel).
const HeaderKind = "Troupe-Kind"

// Forward replies.
const (
	replyAck = "ack"
	replyNak = "nak"
)

// ForwardTimeout bounds how long a node waits for the owner to take a
// forwarded event; well under the JetStream ack wait, so the original
// message is settled before it would be redelivered.
const ForwardTimeout = 10 * time.Second

// Forwarder returns the function job actors use to pass an event to the
// node that owns its job: nil when the owner took it, jobactor.ErrOwnerGone
// when no node listens on the owner's inbox, another error when the owner
// refused it or did not answer in time.
func Forwarder(nc *nats.Conn, subj bus.Subjects) func(owner, kind string, raw []byte) error {
	return ForwarderFrom(nc, subj, "")
}

// ForwarderFrom is Forwarder for node nodeID: each forward is signed in its
// headers by the signer bus.SignAs registered for nodeID, so an owner that
// verifies takes forwards from nodes only.
func ForwarderFrom(nc *nats.Conn, subj bus.Subjects, nodeID string) func(owner, kind string, raw []byte) error {
	return func(owner, kind string, raw []byte) error {
		m := bus.NewSignedMsg(subj.Inbox(owner), nodeID, raw)
		m.Header.Set(HeaderKind, kind)
		reply, err := nc.RequestMsg(m, ForwardTimeout)
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return jobactor.ErrOwnerGone
		case err != nil:
			return err
		case string(reply.Data) != replyAck:
			return errForwardRefused
		}
		return nil
	}
}

// errForwardRefused: the owner answered, but did not take the event.
var errForwardRefused = errors.New("forward: the owner handed the event back")

// inboxDelivery answers a forwarded event's request instead of acking a
// JetStream message: the forwarding node acks its own message on "ack".
type inboxDelivery struct {
	msg  *nats.Msg
	once sync.Once
}

func (d *inboxDelivery) Ack() error {
	d.once.Do(func() { _ = d.msg.Respond([]byte(replyAck)) })
	return nil
}

func (d *inboxDelivery) NakWithDelay(time.Duration) error {
	d.once.Do(func() { _ = d.msg.Respond([]byte(replyNak)) })
	return nil
}

func (d *inboxDelivery) InProgress() error { return nil }

// HandleInbox takes a result or cancel another replica forwarded to this
// node, the owner of its job, or a batch of them (HeaderKind KindBatch).
func (in *Intake) HandleInbox(msg *nats.Msg) {
	kind := msg.Header.Get(HeaderKind)
	refusedAs := inboxKind(kind)
	if kind == KindBatch {
		refusedAs = KindForward
	}
	if !in.Signatures.fromNode(refusedAs, msg) {
		// Not from a node: nothing of it is taken. A batch is answered as
		// one that does not parse.
		if kind == KindBatch {
			r := &nats.Msg{Header: nats.Header{}, Data: []byte(replyNak)}
			r.Header.Set(HeaderKind, KindBatch)
			r.Header.Set(HeaderError, "forwards are taken from nodes only")
			_ = msg.RespondMsg(r)
			return
		}
		_ = msg.Respond([]byte(replyNak))
		return
	}
	if kind == KindBatch {
		in.handleInboxBatch(msg)
		return
	}
	d := &inboxDelivery{msg: msg}
	if !in.takeForwarded(kind, msg.Data, d) {
		_ = d.NakWithDelay(0)
	}
}

// takeForwarded checks a forwarded packet of kind and routes it to its
// job's shard, to be settled through d; false (logged) when it is refused.
func (in *Intake) takeForwarded(kind string, raw []byte, d jobactor.Delivery) bool {
	if in.draining.Load() {
		return false // see Drain
	}
	pkt, err := bus.Decode(raw)
	if err != nil {
		in.Log.Warn("forwarded packet does not decode", "err", err)
		return false
	}
	// The forwarding node took the packet from its stream, verified it,
	// checked its sender's role and its replay window: here the signature
	// is checked again (a replica that does not verify forwards anything),
	// the role too, but not the seen-set (a refused forward is offered
	// again, the same packet).
	by, err := in.Signatures.principal(inboxKind(kind), pkt, raw)
	if err != nil {
		in.Log.Warn("forwarded packet rejected", "kind", kind, "err", err)
		return false
	}
	refuse := func(reason jobstate.Reason, detail string) {
		in.Signatures.count(inboxKind(kind), string(reason))
		in.Log.Warn("forwarded packet refused", "kind", kind, "reason", reason, "detail", detail)
		_ = d.Ack() // refused for good: the forwarding node acks its message
	}
	switch kind {
	case jobactor.ForwardResult:
		if res := pkt.GetJobResult(); res != nil && ValidateEventJobID(res.JobId) == nil {
			if reason, detail := in.Signatures.mayResult(by, pkt); reason != "" {
				refuse(reason, detail)
				return true
			}
			in.route(JobOf(res.JobId), &jobactor.Result{Res: res, TraceID: pkt.TraceId, Delivery: d, Forwarded: true,
				By: jobactor.By(by), Refuse: refuse}, true)
			return true
		}
	case jobactor.ForwardCancel:
		if cn := pkt.GetJobCancel(); cn != nil && ValidateJobID(cn.JobId) == nil {
			if reason, detail := in.Signatures.mayCancel(by); reason != "" {
				refuse(reason, detail)
				return true
			}
			in.route(cn.JobId, &jobactor.Cancel{C: cn, TraceID: pkt.TraceId, Delivery: d, Forwarded: true,
				By: jobactor.By(by), Refuse: refuse}, true)
			return true
		}
	}
	in.Log.Warn("forwarded packet ignored", "kind", kind)
	return false
}
