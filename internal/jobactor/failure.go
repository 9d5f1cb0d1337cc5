package jobactor

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// crash panics as the fault-injection message asks.
func crash(m *Crash) {
	if m.Fatal {
		panic(fmt.Errorf("job actor: injected fatal crash"))
	}
	panic(&Failure{Transient: true, Msg: "job actor: injected transient crash"})
}
