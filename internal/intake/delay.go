package intake

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// DelayHook may take a valid submit out of the submit stream to submit it
// later (schedule.Ticker.Divert: the troupe.run_at / troupe.run_after
// labels). held: it holds the job now, and the submit is acked; bad: a
// malformed label, and the submit is rejected as invalid; err: it could not
// be asked (Redis), and the submit is offered again a second later.
type DelayHook func(req *capv1.JobRequest, trace string, stored time.Time) (held bool, bad string, err error)

// divert gives a submit to in.Delay; it reports whether the submit was
// settled here (held, rejected or offered again).
func (in *Intake) divert(msg jetstream.Msg, req *capv1.JobRequest, trace string) bool {
	if in.Delay == nil {
		return false
	}
	held, bad, err := in.Delay(req, trace, publishedAt(msg))
	switch {
	case err != nil:
		in.Log.Warn("delayed submit not stored; offered again", "job_id", req.JobId, "err", err)
		_ = msg.NakWithDelay(time.Second)
		return true
	case bad != "":
		in.reject(msg, req.JobId, trace, jobstate.ReasonInvalidRequest, "submit: "+bad)
		return true
	case held:
		_ = in.delivery(msg).Ack()
		return true
	}
	return false
}
