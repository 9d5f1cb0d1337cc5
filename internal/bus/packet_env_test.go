package bus_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/proto/capv1"
)

// stampedReq is a request with an env of its own, one key of which a stamp
// overrides.
func stampedReq() *capv1.JobRequest {
	return &capv1.JobRequest{JobId: "j1", Topic: "job.t", Env: map[string]string{"A": "1", "troupe.x": "old"},
		Labels: map[string]string{"l": "v"}, Budget: &capv1.Budget{DeadlineMs: 5000}}
}

// The stamp is appended to the encoded request: decoding the packet finds
// the request's own env and fields, and the stamp, while the request the
// caller holds is neither changed nor re-encoded differently.
func TestRequestEnvAppendsTheStampToTheEncodedRequest(t *testing.T) {
	req := stampedReq()
	before, _ := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	data, err := bus.EncodeRequestEnv("tr", "node-1", req, "troupe.x", "new", "troupe.y", "42")
	if err != nil {
		t.Fatal(err)
	}
	p, err := bus.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	got := p.GetJobRequest()
	want := map[string]string{"A": "1", "troupe.x": "new", "troupe.y": "42"}
	for k, v := range want {
		if got.GetEnv()[k] != v {
			t.Errorf("env[%q] = %q, want %q (env %v)", k, got.GetEnv()[k], v, got.GetEnv())
		}
	}
	if len(got.GetEnv()) != len(want) {
		t.Errorf("env = %v, want %v", got.GetEnv(), want)
	}
	if got.GetJobId() != "j1" || got.GetTopic() != "job.t" || got.GetLabels()["l"] != "v" ||
		got.GetBudget().GetDeadlineMs() != 5000 || p.GetTraceId() != "tr" || p.GetSenderId() != "node-1" {
		t.Errorf("decoded packet lost fields: %v", p)
	}
	after, _ := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if string(before) != string(after) || req.Env["troupe.x"] != "old" || len(req.Env) != 2 {
		t.Errorf("the caller's request was changed: %v", req)
	}
	// No stamp: the plain encoding.
	plain, err := bus.EncodeRequestEnv("tr", "node-1", req)
	if err != nil {
		t.Fatal(err)
	}
	if q, _ := bus.Decode(plain); len(q.GetJobRequest().GetEnv()) != 2 {
		t.Errorf("unstamped env = %v", q.GetJobRequest().GetEnv())
	}
	// A key with no value is refused, not sent half-stamped.
	if _, err := bus.EncodeRequestEnv("tr", "node-1", req, "troupe.x"); err == nil {
		t.Error("an odd list of env entries was encoded")
	}
}

// A signed packet carries the stamp too, and its signature verifies.
func TestRequestEnvSignedPacketVerifies(t *testing.T) {
	s, pub := signer(t)
	req := stampedReq()
	data, err := bus.Encoder{Signer: s}.RequestEnv("tr", "node-s", req, "troupe.y", "7")
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyAs(t, data, "node-s", pub); err != nil {
		t.Fatalf("verify: %v", err)
	}
	p, _ := bus.Decode(data)
	if p.GetJobRequest().GetEnv()["troupe.y"] != "7" || p.GetJobRequest().GetEnv()["A"] != "1" {
		t.Errorf("env = %v", p.GetJobRequest().GetEnv())
	}
	if _, ok := req.Env["troupe.y"]; ok {
		t.Errorf("the caller's request was changed: %v", req.Env)
	}
}

// BenchmarkRequestEnv: the cost of a stamped dispatch's encoding.
func BenchmarkRequestEnv(b *testing.B) {
	req := stampedReq()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bus.EncodeRequestEnv("tr", "node-1", req, "troupe.x", "1234567890123", "troupe.y", "15000"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestEnvelopeIsProtos: the envelope RequestEnv writes by hand is the one
// proto.Marshal writes for NewPacket's fields, byte for byte: empty and
// long ids, times before 1970, on a whole second, at zero.
func TestEnvelopeIsProtos(t *testing.T) {
	long := strings.Repeat("x", 300)
	times := []time.Time{time.Unix(1_764_000_000, 123_456_789), time.Unix(1_764_000_000, 0), time.Unix(0, 5),
		time.Unix(0, 0), time.Unix(-5, 999_999_999), time.Unix(-62135596800, 0), time.Now()}
	for _, ids := range [][2]string{{"tr", "node-1"}, {"", "node-1"}, {"tr", ""}, {"", ""}, {long, "é✓"}} {
		for _, at := range times {
			p := &capv1.BusPacket{TraceId: ids[0], SenderId: ids[1], CreatedAt: timestamppb.New(at), ProtocolVersion: bus.ProtocolVersion}
			want, err := proto.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			if got := bus.AppendEnvelope(nil, ids[0], ids[1], at); string(got) != string(want) {
				t.Errorf("%q %q %v: %x, proto.Marshal %x", ids[0], ids[1], at, got, want)
			}
		}
	}
	// And a whole packet: RequestEnv's bytes with no entries are
	// proto.Marshal's of the packet (its request without maps, so that
	// their order does not differ), but for the clock.
	req := &capv1.JobRequest{JobId: "j1", Topic: "job.t", Budget: &capv1.Budget{DeadlineMs: 5000}}
	data, err := bus.EncodeRequestEnv("tr", "node-1", req)
	if err != nil {
		t.Fatal(err)
	}
	p, err := bus.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	want, err := proto.Marshal(&capv1.BusPacket{TraceId: "tr", SenderId: "node-1", CreatedAt: p.CreatedAt,
		ProtocolVersion: bus.ProtocolVersion, Payload: &capv1.BusPacket_JobRequest{JobRequest: req}})
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != string(want) {
		t.Errorf("RequestEnv %x, proto.Marshal %x", data, want)
	}
}
