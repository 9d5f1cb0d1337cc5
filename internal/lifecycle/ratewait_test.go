package lifecycle

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// rateDriver is a driver whose jobs take one unit of bucket "b" and park
// their wait for it after a second.
func rateDriver(t *testing.T) *driver {
	d := newDriver(t)
	d.j.cfg.RateLimit = func(*capv1.JobRequest) (string, int, string) { return "b", 1, "" }
	d.j.cfg.RateParkAfter = time.Second
	return d
}

// parkedRecord is the record of job-1 parked on n1 waiting for its token.
func parkedRecord(t *testing.T) *WriteResult {
	raw, err := jobstate.EncodeRequest(&capv1.JobRequest{JobId: "job-1", Topic: "job.x"})
	if err != nil {
		t.Fatal(err)
	}
	return &WriteResult{Status: ActivateAdopted, State: jobstate.StateScheduled, Fence: 2, Holder: "n1|1|p",
		Fields: map[string]string{"s": string(jobstate.StateScheduled), "reason": string(jobstate.ReasonRateLimited),
			"rate_bucket": "b", "rate_units": "1", "req": string(raw), "created": "1"}}
}

// A cancel that wakes a parked wait for tokens cancels the job: its actor
// asks again (keeping the place), handles the cancel rather than parking
// again with the cancel held (which would hand it back for ever), and
// leaves the limiter's queue (found by TestRateLimitWaitingJobIsCancellable…).
func TestRateParkedWaitWokenByCancelIsCancelled(t *testing.T) {
	d := rateDriver(t)
	d.feed(&Cancel{C: &capv1.JobCancel{JobId: "job-1"}})
	fx := d.feed(&WriteDone{Epoch: d.step, Res: *parkedRecord(t)})
	take, ok := find[TakeTokens](fx)
	if !ok {
		t.Fatalf("the woken wait did not ask for its tokens again: %v", fx)
	}
	fx = d.feed(&Tokens{Epoch: take.Epoch, Bucket: "b", Units: 1})
	if w, ok := find[Write](fx); ok && w.Op.Kind == OpPark {
		t.Fatalf("parked again with the cancel held: %v", fx)
	}
	leave, ok := find[LeaveTokens](fx)
	if !ok || leave.Epoch != take.Epoch {
		t.Fatalf("the cancelled job did not leave the queue under its ask's epoch: %v", fx)
	}
	w, ok := find[Write](fx)
	if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateCancelled {
		t.Fatalf("no CANCELLED write: %v", fx)
	}
}

// A grant handed to a fresh actor (the wake of a parked wait) is used once:
// the job asks the router without asking the limiter again; if the job is
// no longer there to use it, the units go back.
func TestRateWakeGrantIsUsedOnceOrGivenBack(t *testing.T) {
	d := rateDriver(t)
	d.feed(&Tokens{Granted: true, Bucket: "b", Units: 1})
	fx := d.feed(&WriteDone{Epoch: d.step, Res: *parkedRecord(t)})
	if _, ok := find[TakeTokens](fx); ok {
		t.Fatalf("a woken job with its grant asked the limiter again: %v", fx)
	}
	if _, ok := find[AskRouter](fx); !ok {
		t.Fatalf("a woken job with its grant did not ask the router: %v", fx)
	}

	d = rateDriver(t)
	d.feed(&Tokens{Granted: true, Bucket: "b", Units: 1})
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateBusy, Holder: "n2|5"}})
	leave, ok := find[LeaveTokens](fx)
	if !ok || leave.Return != 1 {
		t.Fatalf("a grant the job cannot use (another node holds it) was not given back: %v", fx)
	}
}
