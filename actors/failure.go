package actors

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/store"
)

// Failure is a job actor's panic value that says whether a restart can help.
type Failure struct {
	Transient bool
	Msg       string
}

func (f *Failure) Error() string { return f.Msg }

// IsTransient reports whether a job actor that panicked with reason should
// be restarted (it reloads its record from Redis and carries on) rather than
// stopped. Transient: a *Failure that says so, and errors of the network or
// of a deadline (an I/O hiccup that escaped as a panic). Everything else — a
// nil dereference, an index out of range, a panic with a string — is a bug
// the same input would hit again: the job is stopped and marked FAILED.
func IsTransient(reason interface{}) bool {
	err, ok := reason.(error)
	if !ok {
		return false
	}
	var f *Failure
	if errors.As(err, &f) {
		return f.Transient
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded)
}

// Abandon tells a job's fresh actor that the previous one failed for good:
// the job is marked FAILED (reason actor_failed, dead-lettered), and its
// worker, if it has one, is told to cancel.
type Abandon struct {
	Detail string
}

func (j *JobActor) onAbandon(c actor.Context, m *Abandon) {
	if j.state.Terminal() {
		j.finish(c)
		return
	}
	entry := j.dlqEntry(core.ReasonActorFailed, m.Detail, j.lastReason)
	hadWorker := j.state == core.StateDispatched || j.state == core.StateRunning
	j.transition(c, &store.Transition{Expect: store.Expect(j.state),
		Path:   []store.Hop{{To: core.StateFailed, Reason: core.ReasonActorFailed}},
		Fields: []string{"error_code", string(core.ReasonActorFailed), "error_message", m.Detail}}, entry,
		func(c actor.Context) {
			j.env.Log.Error("job failed: its actor failed", "job_id", j.id, "trace_id", j.traceID,
				"topic", j.req.GetTopic(), "detail", m.Detail)
			publishDLQ(j.env, entry)
			if hadWorker {
				j.cancelWorker(string(core.ReasonActorFailed))
			}
		})
}

// crash panics as the fault-injection message asks.
func crash(m *Crash) {
	if m.Fatal {
		panic(fmt.Errorf("job actor: injected fatal crash"))
	}
	panic(&Failure{Transient: true, Msg: "job actor: injected transient crash"})
}
