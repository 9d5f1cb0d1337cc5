package intake

import (
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/actors"
	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/internal/metricsx"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/signing"
)

// Signatures checks CAP packet signatures at intake, before a packet is
// acted on in any way. A nil *Signatures (verification off) accepts every
// packet, signed or not.
//
// What a rejection does depends on where the packet came from:
//   - submit, result and cancel streams: dead-lettered with the reason
//     (unsigned_packet, unknown_sender, bad_signature), logged without the
//     packet body, and acked so JetStream does not redeliver it. A rejected
//     result never reaches its job, which keeps waiting and times out as
//     it would have without it;
//   - heartbeats and progress: ignored (a forged heartbeat could attract
//     dispatches, a forged progress could move a job to RUNNING);
//   - results and cancels forwarded to this node's inbox: nak'd, so the
//     forwarding replica offers the original again (the forwarding replica
//     verifies too when it has a key set, so only a forgery sent straight to
//     the inbox, or one forwarded by a replica without verification, gets here).
//
// Every rejection counts in troupe_packets_rejected_total{kind,reason}.
type Signatures struct {
	Verifier *signing.Verifier
	rejected *prometheus.CounterVec
}

// Packet kinds, the "kind" label of troupe_packets_rejected_total.
const (
	KindSubmit    = "submit"
	KindResult    = "result"
	KindCancel    = "cancel"
	KindHeartbeat = "heartbeat"
	KindProgress  = "progress"
)

// NewSignatures returns the intake's signature check over v, registering
// its counter on reg. A nil v returns nil: verification off.
func NewSignatures(v *signing.Verifier, reg prometheus.Registerer) (*Signatures, error) {
	if v == nil {
		return nil, nil
	}
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "troupe_packets_rejected_total",
		Help: "Packets refused by signature verification before anything acted on them, by packet kind and reason.",
	}, []string{"kind", "reason"})
	if reg != nil {
		var err error
		if c, err = metricsx.Register(reg, c); err != nil {
			return nil, err
		}
	}
	return &Signatures{Verifier: v, rejected: c}, nil
}

// check verifies pkt, decoded from raw, and counts a rejection under kind.
func (s *Signatures) check(kind string, pkt *capv1.BusPacket, raw []byte) error {
	if s == nil || s.Verifier == nil {
		return nil
	}
	err := s.Verifier.VerifyRaw(pkt, raw)
	if err != nil {
		s.rejected.WithLabelValues(kind, string(signing.ReasonOf(err))).Inc()
	}
	return err
}

// SignatureReason maps a verification error to the reason code of its DLQ
// entry.
func SignatureReason(err error) core.Reason {
	switch signing.ReasonOf(err) {
	case signing.ReasonUnsigned:
		return core.ReasonUnsignedPacket
	case signing.ReasonUnknownSender:
		return core.ReasonUnknownSender
	default:
		return core.ReasonBadSignature
	}
}

// verified checks a stream message's signature; a rejected message is
// dead-lettered and acked, and verified reports false.
func (in *Intake) verified(msg jetstream.Msg, kind string, pkt *capv1.BusPacket) bool {
	err := in.Signatures.check(kind, pkt, msg.Data())
	if err == nil {
		return true
	}
	in.reject(msg, packetJobID(pkt), pkt.TraceId, SignatureReason(err), kind+": "+err.Error())
	return false
}

// packetJobID is the job id a packet names, if it is a valid one (a
// rejected packet is untrusted: an invalid id is left out of the DLQ entry).
func packetJobID(p *capv1.BusPacket) string {
	var id string
	switch {
	case p.GetJobRequest() != nil:
		id = p.GetJobRequest().GetJobId()
	case p.GetJobResult() != nil:
		id = p.GetJobResult().GetJobId()
	case p.GetJobCancel() != nil:
		id = p.GetJobCancel().GetJobId()
	case p.GetJobProgress() != nil:
		id = p.GetJobProgress().GetJobId()
	}
	if ValidateJobID(id) != nil {
		return ""
	}
	return id
}

// inboxKind is the rejection kind of a forwarded packet.
func inboxKind(header string) string {
	if header == actors.ForwardCancel {
		return KindCancel
	}
	return KindResult
}
