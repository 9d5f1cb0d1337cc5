package jobactor

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// TestAllowAllDoneIsTheCheckedAnswer: the answer a job gets from
// safety.AllowAll without a check is the one a check gives (the decision,
// its record fields, no constraints), with no allocation (the actor keeps
// the answer in itself); appending to its
// record does not write into the shared one.
var allowAllSink lifecycle.PolicyDone

func TestAllowAllDoneIsTheCheckedAnswer(t *testing.T) {
	req := &capv1.JobRequest{JobId: "j", Topic: "job.t", TenantId: "acme", Labels: map[string]string{"a": "b"}}
	dec, err := safety.AllowAll{}.Check(context.Background(), safety.CheckRequest(req))
	want := policyDone(7, dec, err)
	got := allowAllDone(7)
	if got.Epoch != want.Epoch || got.Err != nil || !proto.Equal(got.Dec, want.Dec) ||
		!slices.Equal(got.Record, want.Record) || got.Constrain != nil {
		t.Fatalf("allowAllDone = %+v, the checked answer %+v", got, want)
	}
	if n := testing.AllocsPerRun(100, func() { allowAllSink = allowAllDone(7) }); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
	before := slices.Clone(allowAllRecord)
	_ = append(got.Record, "x", "y")
	if !slices.Equal(allowAllRecord, before) || cap(allowAllRecord) != len(allowAllRecord) {
		t.Errorf("an append reached the shared record: %q (cap %d)", allowAllRecord, cap(allowAllRecord))
	}
}
