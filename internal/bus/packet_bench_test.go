package bus_test

import (
	"testing"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/proto/capv1"
)

// benchRequest is a request of the size the bench submits, plus the labels
// and env a real client tends to send.
func benchRequest() *capv1.JobRequest {
	return &capv1.JobRequest{
		JobId: "r0123456789-12345", Topic: "job.bench", ContextPtr: "redis://ctx:r0123456789-12345",
		TenantId: "acme", Labels: map[string]string{"team": "search", "region": "eu"},
		Env: map[string]string{"MODEL": "small"}, Budget: &capv1.Budget{DeadlineMs: 30_000},
	}
}

func benchResult() *capv1.JobResult {
	return &capv1.JobResult{JobId: "r0123456789-12345", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED,
		ResultPtr: "redis://res:r0123456789-12345", WorkerId: "bw3", ExecutionMs: 12}
}

// The node decodes every submit and result and encodes every dispatch.

func BenchmarkEncodeRequest(b *testing.B) {
	req := benchRequest()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bus.EncodeRequest("trace-1", "node-a", req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeRequest(b *testing.B) {
	data, err := bus.EncodeRequest("trace-1", "client", benchRequest())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bus.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeResult(b *testing.B) {
	res := benchResult()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bus.EncodeResult("trace-1", "bw3", res); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeResult(b *testing.B) {
	data, err := bus.EncodeResult("trace-1", "bw3", benchResult())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bus.Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}
