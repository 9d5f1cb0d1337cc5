package safety

import (
	"errors"
	"fmt"
)

// ErrUnavailable means no policy decision could be had: the kernel timed
// out, was unreachable, answered with an error, or the circuit breaker is
// open. It is never a DENY. A caller in fail-closed mode retries the job
// later with backoff; the KernelClient in fail-open mode never returns it
// (it allows with a warning instead).
var ErrUnavailable = errors.New("safety unavailable")

// ErrInvalidPolicy wraps every policy file validation error, input and
// output alike.
var ErrInvalidPolicy = errors.New("invalid safety policy")

// PolicyError is a policy file error at a line (0 when the line is unknown).
type PolicyError struct {
	Line int
	Msg  string
}

func (e *PolicyError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s: line %d: %s", ErrInvalidPolicy, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", ErrInvalidPolicy, e.Msg)
}

// Is makes errors.Is(err, ErrInvalidPolicy) true.
func (e *PolicyError) Is(target error) bool { return target == ErrInvalidPolicy }
