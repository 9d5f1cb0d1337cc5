package intake

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// DelayHook may take a valid submit out of the submit stream to submit it
// later (schedule.Ticker.Hold: the troupe.run_at / troupe.run_after
// labels). held: it holds the job, and calls settle once it is stored
// (nil: the submit is acked) or could not be (the submit is offered again
// a second later); settle may run on another goroutine. bad: a malformed
// label, and the submit is rejected as invalid. A submit with no labels is
// not delayed: the hook is not asked (mayDelay).
type DelayHook func(req *capv1.JobRequest, trace string, stored time.Time, settle func(error)) (held bool, bad string)

// divert gives a submit to in.Delay; it reports whether the submit is
// settled by it (held, or rejected).
func (in *Intake) divert(msg jetstream.Msg, req *capv1.JobRequest, trace string) bool {
	if in.Delay == nil || !mayDelay(req) {
		// No labels, no delay: the settle func below (one allocation a
		// submit) is made only for a submit the hook may hold (issue 33
		// round 12).
		return false
	}
	held, bad := in.Delay(req, trace, publishedAt(msg), func(err error) {
		if err != nil {
			in.Log.Warn("delayed submit not stored; offered again", "job_id", req.JobId, "err", err)
			_ = msg.NakWithDelay(time.Second)
			return
		}
		_ = in.delivery(msg).Ack()
	})
	if bad != "" {
		in.reject(msg, req.JobId, trace, jobstate.ReasonInvalidRequest, "submit: "+bad)
		return true
	}
	return held
}

// mayDelay reports whether req may be delayed: it has labels (its own or
// its meta's), where the delay is named.
func mayDelay(req *capv1.JobRequest) bool {
	return len(req.GetLabels()) > 0 || len(req.GetMeta().GetLabels()) > 0
}

// CancelDelayedHook removes delayed job jobID, if it is held, not yet
// taken to be submitted, and of one of tenants (store.AnyTenant: any),
// and reports whether it did: the job then never runs. It is called for a
// cancel of a job with no record, once its cancel mark is written (which
// covers a delayed job already taken: it is created CANCELLED).
type CancelDelayedHook func(ctx context.Context, jobID string, tenants []string) bool
