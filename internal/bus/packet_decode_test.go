package bus_test

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/proto/capv1"
)

// decodeCorpus is encoded packets of every shape Decode presets a block
// for, and of those it must not: no timestamp, no payload, other payloads,
// two payloads (the last one wins), a payload whose first copy is merged
// with a second, fields out of order, an empty timestamp, and bytes that
// do not parse.
func decodeCorpus(t *testing.T) map[string][]byte {
	t.Helper()
	enc := func(p *capv1.BusPacket) []byte {
		b, err := proto.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	field := func(num protowire.Number, m proto.Message) []byte {
		b := protowire.AppendTag(nil, num, protowire.BytesType)
		return protowire.AppendBytes(b, enc2(t, m))
	}
	req, err := bus.EncodeRequest("tr", "client", benchRequest())
	if err != nil {
		t.Fatal(err)
	}
	res, err := bus.EncodeResult("tr", "w1", benchResult())
	if err != nil {
		t.Fatal(err)
	}
	env, err := bus.EncodeRequestEnv("tr", "node", benchRequest(), "troupe.dispatched_at", "123")
	if err != nil {
		t.Fatal(err)
	}
	hb, err := bus.EncodeHeartbeat("w1", &capv1.Heartbeat{WorkerId: "w1", Pool: "p", MaxParallelJobs: 4})
	if err != nil {
		t.Fatal(err)
	}
	cancel, err := bus.EncodeCancel("tr", "n", &capv1.JobCancel{JobId: "j", Reason: "r"})
	if err != nil {
		t.Fatal(err)
	}
	res2 := &capv1.JobResult{JobId: "j2", ErrorCode: "x", ArtifactPtrs: []string{"a", "b"}}
	req2 := &capv1.JobRequest{Topic: "t2", Labels: map[string]string{"team": "other", "k": "v"}}
	return map[string][]byte{
		"request":                req,
		"result":                 res,
		"request with env added": env,
		"heartbeat":              hb,
		"cancel":                 cancel,
		"request, no timestamp":  enc(&capv1.BusPacket{TraceId: "t", Payload: &capv1.BusPacket_JobRequest{JobRequest: benchRequest()}}),
		"result, no timestamp":   enc(&capv1.BusPacket{SenderId: "w", Payload: &capv1.BusPacket_JobResult{JobResult: benchResult()}}),
		"no payload":             enc(&capv1.BusPacket{TraceId: "t", CreatedAt: timestamppb.Now(), ProtocolVersion: 1}),
		"nothing":                {},
		"empty request":          field(10, &capv1.JobRequest{}),
		"empty timestamp":        append(field(3, &timestamppb.Timestamp{}), field(11, &capv1.JobResult{})...),
		"request then result":    append(append([]byte(nil), req...), field(11, res2)...),
		"result then request":    append(append([]byte(nil), res...), field(10, req2)...),
		"request merged":         append(append([]byte(nil), req...), field(10, req2)...),
		"result merged":          append(append([]byte(nil), res...), field(11, res2)...),
		"heartbeat then request": append(field(12, &capv1.Heartbeat{WorkerId: "w"}), field(10, req2)...),
		"request then cancel":    append(field(10, req2), field(16, &capv1.JobCancel{JobId: "j"})...),
		"timestamp last":         append(field(11, res2), field(3, timestamppb.Now())...),
		"timestamp twice":        append(append(field(3, &timestamppb.Timestamp{Seconds: 5}), field(11, res2)...), field(3, &timestamppb.Timestamp{Nanos: 7})...),
		"truncated request":      req[:len(req)-3],
		"truncated tag":          {0x80},
		"wrong wire type":        {byte(10<<3 | 0), 1, byte(3<<3 | 0), 2},
	}
}

// encDet encodes m with its maps' entries in key order.
func encDet(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func enc2(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeIsProtoUnmarshal: the packet Decode builds in one block is the
// one proto.Unmarshal builds for every shape in decodeCorpus: equal
// messages, the same sub-messages set and unset, the same payload type,
// the same error or none.
func TestDecodeIsProtoUnmarshal(t *testing.T) {
	for name, data := range decodeCorpus(t) {
		t.Run(name, func(t *testing.T) {
			want := &capv1.BusPacket{}
			wantErr := proto.Unmarshal(data, want)
			got, err := bus.Decode(data)
			if (err != nil) != (wantErr != nil) {
				t.Fatalf("error %v, proto.Unmarshal's %v", err, wantErr)
			}
			if err != nil {
				return
			}
			if !proto.Equal(got, want) {
				t.Fatalf("decoded %v, proto.Unmarshal %v", got, want)
			}
			if (got.CreatedAt == nil) != (want.CreatedAt == nil) {
				t.Errorf("created_at set %v, proto.Unmarshal's %v", got.CreatedAt != nil, want.CreatedAt != nil)
			}
			if g, w := fmt.Sprintf("%T", got.Payload), fmt.Sprintf("%T", want.Payload); g != w {
				t.Errorf("payload %s, proto.Unmarshal's %s", g, w)
			}
			if (got.GetJobRequest() == nil) != (want.GetJobRequest() == nil) || (got.GetJobResult() == nil) != (want.GetJobResult() == nil) {
				t.Errorf("request/result set %v/%v, proto.Unmarshal's %v/%v", got.GetJobRequest() != nil, got.GetJobResult() != nil,
					want.GetJobRequest() != nil, want.GetJobResult() != nil)
			}
			if !proto.Equal(got.GetJobRequest(), want.GetJobRequest()) || !proto.Equal(got.GetJobResult(), want.GetJobResult()) {
				t.Errorf("payload %v, proto.Unmarshal's %v", got.Payload, want.Payload)
			}
			// Encoding again gives the same bytes (unknown fields kept too).
			if g, w := encDet(t, got), encDet(t, want); string(g) != string(w) {
				t.Errorf("re-encoded %x, proto.Unmarshal's %x", g, w)
			}
		})
	}
}

// TestDecodeAllocations: a submit's and a result's envelope, timestamp,
// oneof wrapper and payload are one allocation, not four (the strings and
// maps inside are protobuf's own).
func TestDecodeAllocations(t *testing.T) {
	res, err := bus.EncodeResult("tr", "w1", benchResult())
	if err != nil {
		t.Fatal(err)
	}
	want := &capv1.BusPacket{}
	base := testing.AllocsPerRun(200, func() {
		want = &capv1.BusPacket{}
		if err := proto.Unmarshal(res, want); err != nil {
			t.Fatal(err)
		}
	})
	got := testing.AllocsPerRun(200, func() {
		if _, err := bus.Decode(res); err != nil {
			t.Fatal(err)
		}
	})
	if got != base-3 {
		t.Errorf("a result decodes in %.0f allocations, proto.Unmarshal in %.0f: want 3 fewer", got, base)
	}
}
