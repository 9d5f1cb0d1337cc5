package intake

import (
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/metricsx"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/signing"
)

// Signatures checks CAP packet signatures at intake, before a packet is
// acted on in any way, then whether the verified sender's role and scope
// allow the packet (SECURITY.md, "Roles and scopes"), then the replay
// window. A nil *Signatures (verification off) accepts every packet,
// signed or not: everyone on the bus is trusted.
//
// Who may send what:
//   - submit (JobRequest): clients, for the tenants of their scope, and nodes;
//   - result: workers, with a worker_id their key speaks for, and nodes (the
//     outcomes they tell clients); the job then takes a worker's result only
//     from the worker it is dispatched to (lifecycle: mayReport);
//   - progress: workers (the sender is the worker), checked the same way;
//   - cancel: clients (the job checks its tenant), operators and nodes;
//   - heartbeat: workers, with a worker_id their key speaks for and a pool
//     of their scope;
//   - node-to-node messages (capacity gossip, queue questions, forwards):
//     nodes, signed in headers (FromNode).
//
// Legacy key sets (no roles) let every key act as every role.
//
// What a refusal does depends on where the packet came from:
//   - submit, result and cancel streams: dead-lettered with the reason
//     (unsigned_packet, unknown_sender, bad_signature, forbidden_role,
//     out_of_scope, not_job_worker, stale_packet, replayed), logged without
//     the packet body, and acked so JetStream does not redeliver it. A
//     refused result never reaches its job, or is refused by it, which
//     keeps waiting and times out as it would have without it;
//   - heartbeats and progress: ignored (a forged heartbeat could attract
//     dispatches, a forged progress could move a job to RUNNING);
//   - results and cancels forwarded to this node's inbox: nak'd when the
//     forward or the packet does not verify, acked (taken and dropped)
//     when the packet's sender may not send it;
//   - node-to-node questions and gossip: dropped unanswered.
//
// Every refusal counts in troupe_packets_rejected_total{kind,reason}.
type Signatures struct {
	Verifier *signing.Verifier
	// Replay is the replay window (nil: not checked).
	Replay   *signing.ReplayGuard
	rejected *prometheus.CounterVec
}

// Packet kinds, the "kind" label of troupe_packets_rejected_total.
const (
	KindSubmit    = "submit"
	KindResult    = "result"
	KindCancel    = "cancel"
	KindHeartbeat = "heartbeat"
	KindProgress  = "progress"
	KindCapacity  = "capacity"
	KindQueue     = "queue"
	KindForward   = "forward" // a batch of forwarded events refused whole
)

// NewSignatures returns the intake's signature check over v, registering
// its counter on reg. A nil v returns nil: verification off. replay, when
// set, is the replay window of signed packets.
func NewSignatures(v *signing.Verifier, replay *signing.ReplayGuard, reg prometheus.Registerer) (*Signatures, error) {
	if v == nil {
		return nil, nil
	}
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "troupe_packets_rejected_total",
		Help: "Packets refused by signature verification, the sender's role and scope, or the replay window, by packet kind and reason.",
	}, []string{"kind", "reason"})
	if reg != nil {
		var err error
		if c, err = metricsx.Register(reg, c); err != nil {
			return nil, err
		}
	}
	return &Signatures{Verifier: v, Replay: replay, rejected: c}, nil
}

func (s *Signatures) count(kind, reason string) {
	if s != nil && s.rejected != nil {
		s.rejected.WithLabelValues(kind, reason).Inc()
	}
}

// principal verifies pkt and returns its sender (nil when s is nil:
// verification off), counting a rejection under kind.
func (s *Signatures) principal(kind string, pkt *capv1.BusPacket, raw []byte) (*signing.Principal, error) {
	if s == nil || s.Verifier == nil {
		return nil, nil
	}
	p, err := s.Verifier.VerifyPrincipal(pkt, raw)
	if err != nil {
		s.count(kind, string(signing.ReasonOf(err)))
		return nil, err
	}
	return &p, nil
}

// mayResult: results from workers (for worker ids their key speaks for)
// and nodes.
func (s *Signatures) mayResult(by *signing.Principal, pkt *capv1.BusPacket) (jobstate.Reason, string) {
	if by == nil {
		return "", ""
	}
	if !by.Is(signing.RoleWorker, signing.RoleNode) {
		return jobstate.ReasonForbiddenRole, "a result from " + by.String()
	}
	if by.Role == signing.RoleWorker && !by.SpeaksFor(pkt.GetJobResult().GetWorkerId()) {
		return jobstate.ReasonOutOfScope, "a result naming worker " + truncID(pkt.GetJobResult().GetWorkerId()) + " from " + by.String()
	}
	return "", ""
}

// mayCancel: cancels from clients (their tenants: the job checks),
// operators and nodes.
func (s *Signatures) mayCancel(by *signing.Principal) (jobstate.Reason, string) {
	if by != nil && !by.Is(signing.RoleClient, signing.RoleOperator, signing.RoleNode) {
		return jobstate.ReasonForbiddenRole, "a cancel from " + by.String()
	}
	return "", ""
}

// maySubmit: submits from clients for their tenants, and nodes.
func (s *Signatures) maySubmit(by *signing.Principal, pkt *capv1.BusPacket) (jobstate.Reason, string) {
	if by == nil {
		return "", ""
	}
	if !by.Is(signing.RoleClient, signing.RoleNode) {
		return jobstate.ReasonForbiddenRole, "a submit from " + by.String()
	}
	if t := safety.TenantOf(pkt.GetJobRequest()); !by.ForTenant(t) {
		return jobstate.ReasonOutOfScope, "a submit for tenant " + truncID(t) + " from " + by.String()
	}
	return "", ""
}

// mayHeartbeat: heartbeats from workers, for worker ids their key speaks
// for, in pools of their scope.
func (s *Signatures) mayHeartbeat(by *signing.Principal, hb *capv1.Heartbeat) (jobstate.Reason, string) {
	switch {
	case by == nil:
		return "", ""
	case !by.Is(signing.RoleWorker):
		return jobstate.ReasonForbiddenRole, "a heartbeat from " + by.String()
	case !by.SpeaksFor(hb.GetWorkerId()):
		return jobstate.ReasonOutOfScope, "a heartbeat for worker " + truncID(hb.GetWorkerId()) + " from " + by.String()
	case !by.InPool(hb.GetPool()):
		return jobstate.ReasonOutOfScope, "a heartbeat in pool " + truncID(hb.GetPool()) + " from " + by.String()
	}
	return "", ""
}

// fresh checks the replay window of a stream packet (arrived: when the
// stream stored it; seq: its stream sequence) or, with seq 0, of a core
// NATS packet arrived now.
func (s *Signatures) fresh(pkt *capv1.BusPacket, arrived time.Time, seq uint64, seen bool) (jobstate.Reason, string) {
	if s == nil || s.Replay == nil {
		return "", ""
	}
	if arrived.IsZero() {
		arrived = time.Now()
	}
	if !seen {
		var created time.Time
		if ts := pkt.GetCreatedAt(); ts != nil && ts.IsValid() {
			created = ts.AsTime()
		}
		if !s.Replay.Fresh(created, arrived) {
			return jobstate.ReasonStalePacket, "created_at outside the replay window of " + s.Replay.Skew().String()
		}
		return "", ""
	}
	switch s.Replay.Check(pkt, arrived, seq) {
	case signing.ReasonStale:
		return jobstate.ReasonStalePacket, "created_at outside the replay window of " + s.Replay.Skew().String()
	case signing.ReasonReplayed:
		return jobstate.ReasonReplayed, "a signature taken already within the replay window"
	}
	return "", ""
}

// refusalLabel is the metric reason of a refusal's DLQ reason.
func refusalLabel(r jobstate.Reason) string {
	switch r {
	case jobstate.ReasonStalePacket:
		return string(signing.ReasonStale)
	case jobstate.ReasonReplayed:
		return string(signing.ReasonReplayed)
	}
	return string(r)
}

// FromNode checks a node-to-node message (capacity gossip, a queue
// question, a forward): signed in its headers by a node key, within the
// replay window's skew. Without verification every message is taken. A
// refusal is counted under kind and logged at debug (gossip arrives
// twice a second from every replica).
func (s *Signatures) FromNode(kind string, m *nats.Msg) bool { return s.fromNode(kind, m) }

func (s *Signatures) fromNode(kind string, m *nats.Msg) bool {
	if s == nil || s.Verifier == nil {
		return true
	}
	h := m.Header
	p, at, err := s.Verifier.VerifyMessage(m.Subject, h.Get(bus.HeaderSender), h.Get(bus.HeaderSignedAt), h.Get(bus.HeaderSig), m.Data)
	switch {
	case err != nil:
		s.count(kind, string(signing.ReasonOf(err)))
		return false
	case !p.Is(signing.RoleNode):
		s.count(kind, string(jobstate.ReasonForbiddenRole))
		return false
	case s.Replay != nil && !s.Replay.Fresh(at, time.Now()):
		s.count(kind, string(signing.ReasonStale))
		return false
	}
	return true
}

// SignatureReason maps a verification error to the reason code of its DLQ
// entry.
func SignatureReason(err error) jobstate.Reason {
	switch signing.ReasonOf(err) {
	case signing.ReasonUnsigned:
		return jobstate.ReasonUnsignedPacket
	case signing.ReasonUnknownSender:
		return jobstate.ReasonUnknownSender
	default:
		return jobstate.ReasonBadSignature
	}
}

// verified checks a stream message's signature, its sender's right to send
// it and its replay window; a refused message is dead-lettered and acked,
// and verified reports false.
func (in *Intake) verified(msg jetstream.Msg, kind string, pkt *capv1.BusPacket) (*signing.Principal, bool) {
	by, err := in.Signatures.principal(kind, pkt, msg.Data())
	if err != nil {
		in.reject(msg, packetJobID(pkt), pkt.TraceId, SignatureReason(err), kind+": "+err.Error())
		return nil, false
	}
	if by == nil {
		return nil, true
	}
	var reason jobstate.Reason
	var detail string
	switch kind {
	case KindSubmit:
		if pkt.GetJobRequest() != nil {
			reason, detail = in.Signatures.maySubmit(by, pkt)
		}
	case KindResult:
		if pkt.GetJobResult() != nil {
			reason, detail = in.Signatures.mayResult(by, pkt)
		}
	case KindCancel:
		reason, detail = in.Signatures.mayCancel(by)
	}
	if reason == "" {
		var seq uint64
		if md, err := msg.Metadata(); err == nil {
			seq = md.Sequence.Stream
		}
		reason, detail = in.Signatures.fresh(pkt, publishedAt(msg), seq, true)
	}
	if reason != "" {
		in.Signatures.count(kind, refusalLabel(reason))
		in.reject(msg, packetJobID(pkt), pkt.TraceId, reason, kind+": "+detail)
		return nil, false
	}
	return by, true
}

// refuser returns how a job refuses a stream message's event: dead-lettered
// (with the raw packet) and counted under kind, then acked.
func (in *Intake) refuser(msg jetstream.Msg, kind string, pkt *capv1.BusPacket) func(jobstate.Reason, string) {
	return func(reason jobstate.Reason, detail string) {
		in.Signatures.count(kind, refusalLabel(reason))
		// The DLQ write is Redis I/O: off the job actor's goroutine.
		go in.reject(msg, packetJobID(pkt), pkt.TraceId, reason, kind+": "+detail)
	}
}

// truncID bounds an untrusted id repeated in a refusal's detail.
func truncID(s string) string {
	const max = 128
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

// packetJobID is the job id a packet names, if it is a valid one (a
// rejected packet is untrusted: an invalid id is left out of the DLQ entry).
func packetJobID(p *capv1.BusPacket) string {
	var id string
	switch {
	case p.GetJobRequest() != nil:
		id = p.GetJobRequest().GetJobId()
	case p.GetJobResult() != nil:
		id = JobOf(p.GetJobResult().GetJobId())
	case p.GetJobCancel() != nil:
		id = p.GetJobCancel().GetJobId()
	case p.GetJobProgress() != nil:
		id = JobOf(p.GetJobProgress().GetJobId())
	}
	if ValidateJobID(id) != nil {
		return ""
	}
	return id
}

// inboxKind is the rejection kind of a forwarded packet.
func inboxKind(header string) string {
	if header == jobactor.ForwardCancel {
		return KindCancel
	}
	return KindResult
}
