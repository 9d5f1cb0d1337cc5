package bus

import (
	"time"

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

// EncodeRequest marshals a JobRequest packet.
func EncodeRequest(traceID, sender string, req *capv1.JobRequest) ([]byte, error) {
	p := NewPacket(traceID, sender)
	p.Payload = &capv1.BusPacket_JobRequest{JobRequest: req}
	return proto.Marshal(p)
}

// EncodeResult marshals a JobResult packet.
func EncodeResult(traceID, sender string, res *capv1.JobResult) ([]byte, error) {
	p := NewPacket(traceID, sender)
	p.Payload = &capv1.BusPacket_JobResult{JobResult: res}
	return proto.Marshal(p)
}

// EncodeHeartbeat marshals a Heartbeat packet.
func EncodeHeartbeat(sender string, hb *capv1.Heartbeat) ([]byte, error) {
	p := NewPacket("", sender)
	p.Payload = &capv1.BusPacket_Heartbeat{Heartbeat: hb}
	return proto.Marshal(p)
}

// EncodeProgress marshals a JobProgress packet.
func EncodeProgress(traceID, sender string, pr *capv1.JobProgress) ([]byte, error) {
	p := NewPacket(traceID, sender)
	p.Payload = &capv1.BusPacket_JobProgress{JobProgress: pr}
	return proto.Marshal(p)
}

// EncodeCancel marshals a JobCancel packet.
func EncodeCancel(traceID, sender string, c *capv1.JobCancel) ([]byte, error) {
	p := NewPacket(traceID, sender)
	p.Payload = &capv1.BusPacket_JobCancel{JobCancel: c}
	return proto.Marshal(p)
}

// Decode unmarshals a CAP envelope.
func Decode(data []byte) (*capv1.BusPacket, error) {
	p := &capv1.BusPacket{}
	if err := proto.Unmarshal(data, p); err != nil {
		return nil, err
	}
	return p, nil
}
