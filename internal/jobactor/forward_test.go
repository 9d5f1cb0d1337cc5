package jobactor

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestForwardRetryDelayWaitsForAGoneOwnersLock: an event whose owner is
// gone waits for the owner's lock to lapse (a parked lock: one lock TTL),
// bounded; any other failed forward is retried after a second.
func TestForwardRetryDelayWaitsForAGoneOwnersLock(t *testing.T) {
	left := func(d time.Duration, err error) func(context.Context, string) (time.Duration, error) {
		return func(context.Context, string) (time.Duration, error) { return d, err }
	}
	const ttl = time.Minute
	for _, c := range []struct {
		name   string
		err    error
		remain func(context.Context, string) (time.Duration, error)
		want   time.Duration
	}{
		{"gone, lock 30 s left", ErrOwnerGone, left(30*time.Second, nil), 30*time.Second + 250*time.Millisecond},
		{"gone, parked lock", ErrOwnerGone, left(-1, nil), ttl},
		{"gone, lock already lapsed", ErrOwnerGone, left(0, nil), time.Second},
		{"gone, lock TTL past the bound", ErrOwnerGone, left(time.Hour, nil), ForwardRetryMax},
		{"gone, Redis error", ErrOwnerGone, left(0, errors.New("down")), time.Second},
		{"refused by a live owner", errors.New("handed back"), left(30*time.Second, nil), time.Second},
		{"gone, no lock reader", ErrOwnerGone, nil, time.Second},
	} {
		if got := ForwardRetryDelay(c.err, c.remain, ttl, "job"); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
