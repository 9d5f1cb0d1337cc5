package policyx

import (
	"fmt"

	"github.com/troupe-run/troupe/safety"
)

// UnavailableError says why a check had no decision. errors.Is(err,
// safety.ErrUnavailable) holds for every one.
type UnavailableError struct {
	// BreakerOpen: the circuit was open (or half-open with every probe slot
	// taken), so the kernel was not called at all.
	BreakerOpen bool
	// Cause is the call's error (nil when BreakerOpen).
	Cause error
}

func (e *UnavailableError) Error() string {
	if e.BreakerOpen {
		return safety.ErrUnavailable.Error() + ": circuit open"
	}
	return fmt.Sprintf("%s: %v", safety.ErrUnavailable, e.Cause)
}

// Is makes errors.Is(err, safety.ErrUnavailable) true.
func (e *UnavailableError) Is(target error) bool { return target == safety.ErrUnavailable }

// Unwrap exposes the call's error (a gRPC status, a context error).
func (e *UnavailableError) Unwrap() error { return e.Cause }
