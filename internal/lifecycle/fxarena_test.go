package lifecycle

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// TestPointerEffectsOwnership: the pointer effects a Step returns keep
// their values through the next Step when the shell does not call
// Consumed (tests, tools); after Consumed, the storage is the pool's and
// the job holds none of it; and a step's pointer effects past the arena's
// room are effects of their own, each with its value.
func TestPointerEffectsOwnership(t *testing.T) {
	d := newDriver(t)
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}})
	fx := d.j.Step(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}}, d)
	var epoch uint64
	var kept []Effect
	var vals []any
	for _, e := range fx {
		switch e := e.(type) {
		case *Write:
			kept, vals = append(kept, e), append(vals, *e)
		case *AskRouter:
			kept, vals = append(kept, e), append(vals, *e)
			epoch = e.Req.(*PickRequest).Epoch
		case *Arm:
			kept, vals = append(kept, e), append(vals, *e)
		}
	}
	if len(kept) == 0 {
		t.Fatalf("an allowed job's step emitted no pointer effect: %v", fx)
	}
	// The next step emits pointer effects of the same kinds (a write, a
	// timer).
	if fx := d.feed(&PickReply{Epoch: epoch, WorkerID: "w1", Subject: "worker.w1.jobs"}); len(fx) == 0 {
		t.Fatalf("a placement emitted nothing")
	}
	for i, e := range kept {
		var now any
		switch e := e.(type) {
		case *Write:
			now = *e
		case *AskRouter:
			now = *e
		case *Arm:
			now = *e
		}
		if now != vals[i] {
			t.Errorf("effect %d changed by the next Step (no Consumed): %v, was %v", i, now, vals[i])
		}
	}
	d.j.Consumed()
	if d.j.fxa != nil {
		t.Errorf("the job still holds its step's storage after Consumed")
	}

	// More of one kind than the arena holds: each is its own effect.
	j := &Job{}
	for i := range 5 {
		j.ack(testDelivery(i))
	}
	if len(j.fx) != 5 {
		t.Fatalf("%d effects, want 5", len(j.fx))
	}
	for i, e := range j.fx {
		if a, ok := e.(*Ack); !ok || a.D != testDelivery(i) {
			t.Errorf("effect %d is %v, want the ack of delivery %d", i, e, i)
		}
	}
	j.Consumed()
}

// testDelivery is a comparable Delivery that does nothing.
type testDelivery int

func (testDelivery) Ack() error                       { return nil }
func (testDelivery) NakWithDelay(time.Duration) error { return nil }
func (testDelivery) InProgress() error                { return nil }
