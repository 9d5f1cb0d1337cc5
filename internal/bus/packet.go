package bus

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/troupe-run/troupe/proto/capv1"
)

// ProtocolVersion is the CAP envelope version Troupe speaks.
const ProtocolVersion = 1

// NewPacket wraps a payload in a CAP envelope from sender, keeping traceID.
func NewPacket(traceID, sender string) *capv1.BusPacket {
	return &capv1.BusPacket{TraceId: traceID, SenderId: sender,
		CreatedAt: timestamppb.New(time.Now()), ProtocolVersion: ProtocolVersion}
}

// Sealer signs a packet (CAP field 14) and returns it marshalled;
// *signing.Signer is one.
type Sealer interface {
	Seal(p *capv1.BusPacket) ([]byte, error)
}

// MessageSigner signs the body of a node-to-node message that is not a CAP
// packet (capacity gossip, queue questions, forwards) into NATS headers;
// *signing.Signer is one.
type MessageSigner interface {
	SignMessage(subject string, at time.Time, data []byte) (signedAt, sig string, err error)
}

// Header names of a signed node-to-node message (as in package signing).
const (
	HeaderSender   = "Troupe-Sender"
	HeaderSignedAt = "Troupe-Signed-At"
	HeaderSig      = "Troupe-Signature"
)

// NewSignedMsg returns a message on subject carrying data from sender, its
// body signed in headers by the signer SignAs registered for sender when
// that signer is a MessageSigner (otherwise it carries the sender alone,
// which a node that verifies refuses).
func NewSignedMsg(subject, sender string, data []byte) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = data
	m.Header.Set(HeaderSender, sender)
	if reg := signers.Load(); reg != nil {
		if s, ok := (*reg)[sender].(MessageSigner); ok {
			if at, sig, err := s.SignMessage(subject, time.Now(), data); err == nil {
				m.Header.Set(HeaderSignedAt, at)
				m.Header.Set(HeaderSig, sig)
			}
		}
	}
	return m
}

// Encoder marshals CAP packets. With Signer set, it signs every packet it
// encodes; otherwise it signs those whose sender id a SignAs registered, and
// marshals the rest unsigned, as before signatures existed. The zero
// Encoder is what the package-level Encode* helpers use.
type Encoder struct {
	Signer Sealer
}

// Marshal encodes p, signing it as described on Encoder.
func (e Encoder) Marshal(p *capv1.BusPacket) ([]byte, error) {
	if e.Signer != nil {
		return e.Signer.Seal(p)
	}
	if m := signers.Load(); m != nil {
		if s, ok := (*m)[p.SenderId]; ok {
			return s.Seal(p)
		}
	}
	return proto.Marshal(p)
}

// Request marshals a JobRequest packet.
func (e Encoder) Request(traceID, sender string, req *capv1.JobRequest) ([]byte, error) {
	p := NewPacket(traceID, sender)
	p.Payload = &capv1.BusPacket_JobRequest{JobRequest: req}
	return e.Marshal(p)
}

// RequestEnv marshals a JobRequest packet whose env also holds kv (key,
// value pairs; a key req's env has already is overridden), without copying
// or changing req: an unsigned packet's envelope is written by hand
// (appendEnvelope), and the entries are appended to its encoded request
// (protobuf concatenates a message's fields, and a later map entry
// replaces an earlier one of the same key). A signed packet is signed over
// what it carries, so req is copied and stamped first.
func (e Encoder) RequestEnv(traceID, sender string, req *capv1.JobRequest, kv ...string) ([]byte, error) {
	if len(kv)%2 != 0 {
		return nil, errors.New("bus: env entries must come as key, value pairs")
	}
	if e.signs(sender) {
		if len(kv) == 0 {
			return e.Request(traceID, sender, req)
		}
		out := proto.Clone(req).(*capv1.JobRequest)
		if out.Env == nil {
			out.Env = make(map[string]string, len(kv)/2)
		}
		for i := 0; i < len(kv); i += 2 {
			out.Env[kv[i]] = kv[i+1]
		}
		return e.Request(traceID, sender, out)
	}
	extra := 0
	for i := 0; i < len(kv); i += 2 {
		n := envEntrySize(kv[i], kv[i+1])
		extra += protowire.SizeTag(envField) + protowire.SizeBytes(n)
	}
	size := proto.Size(req)
	// Room for the envelope's own fields (ids, a timestamp) besides.
	buf := make([]byte, 0, size+extra+len(traceID)+len(sender)+48)
	buf = appendEnvelope(buf, traceID, sender, time.Now())
	buf = protowire.AppendTag(buf, requestField, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(size+extra))
	start := len(buf)
	// Sized a moment ago: encoded with that size (a request is not changed
	// once built; the length check below catches one that was).
	buf, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(buf, req)
	if err != nil {
		return nil, err
	}
	if len(buf)-start != size {
		// req changed between its sizing and its encoding: encode a copy.
		return e.RequestEnv(traceID, sender, proto.Clone(req).(*capv1.JobRequest), kv...)
	}
	for i := 0; i < len(kv); i += 2 {
		buf = protowire.AppendTag(buf, envField, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(envEntrySize(kv[i], kv[i+1])))
		buf = protowire.AppendTag(buf, 1, protowire.BytesType)
		buf = protowire.AppendString(buf, kv[i])
		buf = protowire.AppendTag(buf, 2, protowire.BytesType)
		buf = protowire.AppendString(buf, kv[i+1])
	}
	return buf, nil
}

// appendEnvelope appends the fields NewPacket(traceID, sender) sets, at
// at, encoded as proto.Marshal encodes them (in field number order, zero
// values left out): what comes before an unsigned packet's payload, with
// no packet or timestamp allocated.
func appendEnvelope(b []byte, traceID, sender string, at time.Time) []byte {
	if traceID != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, traceID)
	}
	if sender != "" {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, sender)
	}
	// created_at: a google.protobuf.Timestamp (seconds 1, nanos 2).
	secs, nanos := at.Unix(), int64(at.Nanosecond())
	n := 0
	if secs != 0 {
		n += protowire.SizeTag(1) + protowire.SizeVarint(uint64(secs))
	}
	if nanos != 0 {
		n += protowire.SizeTag(2) + protowire.SizeVarint(uint64(nanos))
	}
	b = protowire.AppendTag(b, createdAtField, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	if secs != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(secs))
	}
	if nanos != 0 {
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(nanos))
	}
	b = protowire.AppendTag(b, 4, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(int64(ProtocolVersion)))
}

// CAP field numbers RequestEnv writes: BusPacket.job_request and
// JobRequest.env (a map entry: key 1, value 2).
const (
	requestField protowire.Number = 10
	envField     protowire.Number = 6
)

func envEntrySize(k, v string) int {
	return protowire.SizeTag(1) + protowire.SizeBytes(len(k)) + protowire.SizeTag(2) + protowire.SizeBytes(len(v))
}

// signs reports whether e signs packets from sender.
func (e Encoder) signs(sender string) bool {
	if e.Signer != nil {
		return true
	}
	if m := signers.Load(); m != nil {
		_, ok := (*m)[sender]
		return ok
	}
	return false
}

// Result marshals a JobResult packet.
func (e Encoder) Result(traceID, sender string, res *capv1.JobResult) ([]byte, error) {
	p := NewPacket(traceID, sender)
	p.Payload = &capv1.BusPacket_JobResult{JobResult: res}
	return e.Marshal(p)
}

// Heartbeat marshals a Heartbeat packet.
func (e Encoder) Heartbeat(sender string, hb *capv1.Heartbeat) ([]byte, error) {
	p := NewPacket("", sender)
	p.Payload = &capv1.BusPacket_Heartbeat{Heartbeat: hb}
	return e.Marshal(p)
}

// Progress marshals a JobProgress packet.
func (e Encoder) Progress(traceID, sender string, pr *capv1.JobProgress) ([]byte, error) {
	p := NewPacket(traceID, sender)
	p.Payload = &capv1.BusPacket_JobProgress{JobProgress: pr}
	return e.Marshal(p)
}

// Cancel marshals a JobCancel packet.
func (e Encoder) Cancel(traceID, sender string, c *capv1.JobCancel) ([]byte, error) {
	p := NewPacket(traceID, sender)
	p.Payload = &capv1.BusPacket_JobCancel{JobCancel: c}
	return e.Marshal(p)
}

// EncodeRequest marshals a JobRequest packet.
func EncodeRequest(traceID, sender string, req *capv1.JobRequest) ([]byte, error) {
	return Encoder{}.Request(traceID, sender, req)
}

// EncodeRequestEnv marshals a JobRequest packet with kv added to its env
// (see Encoder.RequestEnv).
func EncodeRequestEnv(traceID, sender string, req *capv1.JobRequest, kv ...string) ([]byte, error) {
	return Encoder{}.RequestEnv(traceID, sender, req, kv...)
}

// EncodeResult marshals a JobResult packet.
func EncodeResult(traceID, sender string, res *capv1.JobResult) ([]byte, error) {
	return Encoder{}.Result(traceID, sender, res)
}

// EncodeHeartbeat marshals a Heartbeat packet.
func EncodeHeartbeat(sender string, hb *capv1.Heartbeat) ([]byte, error) {
	return Encoder{}.Heartbeat(sender, hb)
}

// EncodeCancel marshals a JobCancel packet.
func EncodeCancel(traceID, sender string, c *capv1.JobCancel) ([]byte, error) {
	return Encoder{}.Cancel(traceID, sender, c)
}

// Decode unmarshals a CAP envelope.
//
// The envelope, its timestamp and a JobRequest or JobResult payload with
// its oneof wrapper (what a node reads per job: a submit and a result) are
// allocated as one block, where protobuf allocates each on its own: a
// merge into a message whose sub-message pointers are already set fills
// them in place. Only the fields data holds are set beforehand (a scan of
// its top-level tags), so the packet is the one proto.Unmarshal makes:
// a field data does not hold stays nil, and a later payload of another
// type replaces the wrapper as it would replace a fresh one.
//
// A submit or a result as the encoders write it is decoded without
// protobuf's reflection, its strings sharing one copy of data (see
// fastDecode); anything else goes through proto.Unmarshal as above.
func Decode(data []byte) (*capv1.BusPacket, error) {
	if p := fastDecode(data); p != nil {
		return p, nil
	}
	p := preset(data)
	if err := mergeOpts.Unmarshal(data, p); err != nil {
		return nil, err
	}
	return p, nil
}

// mergeOpts unmarshals into the sub-messages preset set.
var mergeOpts = proto.UnmarshalOptions{Merge: true}

// The blocks Decode allocates a packet in (see preset).
type (
	requestBlock struct {
		p   capv1.BusPacket
		ts  timestamppb.Timestamp
		w   capv1.BusPacket_JobRequest
		req capv1.JobRequest
	}
	resultBlock struct {
		p   capv1.BusPacket
		ts  timestamppb.Timestamp
		w   capv1.BusPacket_JobResult
		res capv1.JobResult
	}
	packetBlock struct {
		p  capv1.BusPacket
		ts timestamppb.Timestamp
	}
)

// BusPacket's field numbers preset reads.
const (
	createdAtField protowire.Number = 3
	resultField    protowire.Number = 11
)

// preset returns an empty packet for data, allocated with the sub-messages
// data's top-level fields hold (created_at; the first payload when it is a
// job_request or job_result) and those set in it. Data it cannot scan gets
// a bare packet: the unmarshal reports what is wrong with it.
func preset(data []byte) *capv1.BusPacket {
	var ts bool
	var payload protowire.Number
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return &capv1.BusPacket{}
		}
		b = b[n:]
		if num == createdAtField && typ == protowire.BytesType {
			ts = true
		} else if payload == 0 && (num == requestField || num == resultField) && typ == protowire.BytesType {
			payload = num
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return &capv1.BusPacket{}
		}
		b = b[n:]
	}
	switch payload {
	case requestField:
		blk := &requestBlock{}
		blk.w.JobRequest = &blk.req
		blk.p.Payload = &blk.w
		if ts {
			blk.p.CreatedAt = &blk.ts
		}
		return &blk.p
	case resultField:
		blk := &resultBlock{}
		blk.w.JobResult = &blk.res
		blk.p.Payload = &blk.w
		if ts {
			blk.p.CreatedAt = &blk.ts
		}
		return &blk.p
	}
	if ts {
		blk := &packetBlock{}
		blk.p.CreatedAt = &blk.ts
		return &blk.p
	}
	return &capv1.BusPacket{}
}

// The signers registered by SignAs. Encoding reads an immutable snapshot
// (one atomic load, nil when nothing is registered); SignAs and its release
// rebuild it under signersMu.
var (
	signers    atomic.Pointer[map[string]Sealer]
	signersMu  sync.Mutex
	signerRegs = map[string][]signerReg{} // sender → registrations, latest last; guarded by signersMu
	signerSeq  uint64                     // guarded by signersMu
)

type signerReg struct {
	id uint64
	s  Sealer
}

// SignAs makes this process sign, with s, every packet the Encode* helpers
// (and zero Encoders) encode with sender id sender, until release is called.
// This is how a node signs everything it publishes without each publish
// point knowing about keys: dispatches, cancels, sys.job.dlq events and
// saga submits all go through Encode*.
//
// Registrations are process-wide and keyed by sender id alone: if two
// components of one process register the same sender id, the latest
// registration signs until it is released, then the earlier one again.
// Give each node (and worker) in a process its own id.
func SignAs(sender string, s Sealer) (release func()) {
	signersMu.Lock()
	defer signersMu.Unlock()
	signerSeq++
	id := signerSeq
	signerRegs[sender] = append(signerRegs[sender], signerReg{id: id, s: s})
	publishSignersLocked()
	var once sync.Once
	return func() {
		once.Do(func() {
			signersMu.Lock()
			defer signersMu.Unlock()
			regs := signerRegs[sender]
			for i, r := range regs {
				if r.id == id {
					regs = append(regs[:i:i], regs[i+1:]...)
					break
				}
			}
			if len(regs) == 0 {
				delete(signerRegs, sender)
			} else {
				signerRegs[sender] = regs
			}
			publishSignersLocked()
		})
	}
}

func publishSignersLocked() {
	if len(signerRegs) == 0 {
		signers.Store(nil)
		return
	}
	m := make(map[string]Sealer, len(signerRegs))
	for sender, regs := range signerRegs {
		m[sender] = regs[len(regs)-1].s
	}
	signers.Store(&m)
}

// PeekResultJobID returns the job_id of the JobResult an envelope carries
// (BusPacket field 11, JobResult field 1), read in place without decoding
// the packet: a slice of data, valid as long as data is. ok is false when
// data holds no JobResult with a job id, or is not well-formed as far as
// the scan reads. Of several job_result fields (a merge, which no encoder
// writes) it reads the last; callers use it only to skip a full decode,
// never to decide what a packet means.
func PeekResultJobID(data []byte) (id []byte, ok bool) {
	res, ok := lastBytesField(data, resultField)
	if !ok {
		return nil, false
	}
	id, ok = lastBytesField(res, 1)
	return id, ok && len(id) > 0
}

// lastBytesField returns the last length-delimited field num of message b.
func lastBytesField(b []byte, num protowire.Number) (v []byte, ok bool) {
	for len(b) > 0 {
		n, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			return nil, false
		}
		b = b[k:]
		if n == num && typ == protowire.BytesType {
			s, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, false
			}
			v, ok, b = s, true, b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(n, typ, b)
		if m < 0 {
			return nil, false
		}
		b = b[m:]
	}
	return v, ok
}
