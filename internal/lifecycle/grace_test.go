package lifecycle

import (
	"testing"

	"github.com/troupe-run/troupe/proto/capv1"
)

// A recheck or a repeated submit of a job waiting within its grace that
// the router answers with a worker ends the grace (issue 27, item 5): its
// unwritten budget and its submit's touches are released, and its
// admission ends, before it is created and dispatched.
func TestGraceEndsWhenARecheckOrARepeatedSubmitIsPlaced(t *testing.T) {
	for _, how := range []string{"recheck", "repeated submit"} {
		t.Run(how, func(t *testing.T) {
			d := newDriver(t)
			waiting := d.beginUnwritten // a repeated submit comes within the admission hold
			if how == "recheck" {
				waiting = d.waitUnwritten
			}
			if !waiting(&submitDelivery{}) {
				t.Fatal("no unwritten wait")
			}
			if how == "recheck" {
				d.now = d.now.Add(CapacityRecheck)
				fx := d.feed(&Timer{Epoch: d.timer})
				if _, ok := find[*AskRouter](fx); !ok {
					t.Fatalf("no recheck at CapacityRecheck: %v", fx)
				}
			} else {
				d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}})
				d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
			}
			var graced, admitted bool
			for _, e := range d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"}) {
				switch e := e.(type) {
				case *Grace:
					graced = graced || e.Delta == -1
				case Admitted:
					admitted = true
				}
			}
			if !graced || (d.j.res == Unwritten) {
				t.Fatalf("placed on a %s: grace not left (unwritten %v)", how, (d.j.res == Unwritten))
			}
			if how == "repeated submit" && !admitted {
				t.Fatalf("placed on a %s within the admission hold: admission not ended", how)
			}
		})
	}
}
