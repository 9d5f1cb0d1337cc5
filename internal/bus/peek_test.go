package bus_test

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/proto/capv1"
)

// PeekResultJobID reads a result's job id where the full decode would, and
// reports nothing for packets without one or with broken framing.
func TestPeekResultJobIDReadsWhatDecodeReads(t *testing.T) {
	res, err := bus.EncodeResult("trace-1", "w1", &capv1.JobResult{JobId: "job-7#2", WorkerId: "w1",
		Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: "redis://r", ErrorMessage: "none"})
	if err != nil {
		t.Fatal(err)
	}
	id, ok := bus.PeekResultJobID(res)
	if !ok || string(id) != "job-7#2" {
		t.Fatalf("peek = %q, %v; want job-7#2", id, ok)
	}
	pkt, err := bus.Decode(res)
	if err != nil || pkt.GetJobResult().GetJobId() != string(id) {
		t.Fatalf("decode reads %q (%v), peek %q", pkt.GetJobResult().GetJobId(), err, id)
	}
	if n := testing.AllocsPerRun(100, func() { bus.PeekResultJobID(res) }); n != 0 {
		t.Errorf("peek allocates %v times", n)
	}

	req, err := bus.EncodeRequest("trace-2", "client", &capv1.JobRequest{JobId: "job-8", Topic: "job.echo"})
	if err != nil {
		t.Fatal(err)
	}
	noID, err := bus.EncodeResult("t", "w", &capv1.JobResult{WorkerId: "w"})
	if err != nil {
		t.Fatal(err)
	}
	// A later job_result's id wins, as a merging decode's would.
	inner := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "job-9")
	twice := append(append([]byte{}, res...), protowire.AppendBytes(protowire.AppendTag(nil, 11, protowire.BytesType), inner)...)
	if id, ok := bus.PeekResultJobID(twice); !ok || string(id) != "job-9" {
		t.Errorf("two job_results: peek = %q, %v; want the last, job-9", id, ok)
	}
	if pkt, err := bus.Decode(twice); err != nil || pkt.GetJobResult().GetJobId() != "job-9" {
		t.Errorf("two job_results: decode reads %q (%v)", pkt.GetJobResult().GetJobId(), err)
	}
	for name, data := range map[string][]byte{
		"a request":           req,
		"a result with no id": noID,
		"empty":               nil,
		"cut short":           res[:len(res)-3],
		"a bad tag":           {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	} {
		if id, ok := bus.PeekResultJobID(data); ok {
			t.Errorf("%s: peek = %q, want nothing", name, id)
		}
	}
}
