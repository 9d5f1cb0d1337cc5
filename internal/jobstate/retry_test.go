package jobstate

import (
	"errors"
	"testing"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// The backoff doubles from BackoffMin, is capped at BackoffMax, and is
// jittered down by at most half.
func TestRetryPolicyBackoffDoublesWithinItsCapAndJitter(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 5, BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second}
	for next, full := range map[int]time.Duration{2: 100 * time.Millisecond, 3: 200 * time.Millisecond,
		4: 400 * time.Millisecond, 5: 800 * time.Millisecond, 6: time.Second, 60: time.Second} {
		if got := p.Backoff(next, 0); got != full {
			t.Errorf("attempt %d without jitter: %v, want %v", next, got, full)
		}
		if got := p.Backoff(next, uint64(full/2)); got != full/2 {
			t.Errorf("attempt %d, most jitter: %v, want %v", next, got, full/2)
		}
	}
}

// Attempt ids read back as their job and number; nothing else does.
func TestRetryPolicyAttemptIDsReadBack(t *testing.T) {
	if id, n := SplitAttempt(AttemptID("job-1", 12)); id != "job-1" || n != 12 {
		t.Fatalf("read back %q %d", id, n)
	}
	for _, plain := range []string{"job-1", "~a1", "job~a", "job~a0", "job~a1x", "job~a12345"} {
		if id, n := SplitAttempt(plain); id != plain || n != 0 {
			t.Errorf("%q read as %q attempt %d", plain, id, n)
		}
	}
}

// A job's meta.labels override its topic's policy field by field; a label
// that does not parse, or a policy out of bounds, is an error.
func TestRetryPolicyLabelsOverrideTheTopic(t *testing.T) {
	topic := RetryPolicy{MaxAttempts: 5, BackoffMin: time.Second, BackoffMax: time.Minute}
	req := &capv1.JobRequest{Meta: &capv1.JobMetadata{Labels: map[string]string{LabelRetryAttempts: "2",
		LabelRetryBackoffMax: "10s"}}}
	got, err := RetryPolicyOf(req, topic)
	if err != nil || got != (RetryPolicy{MaxAttempts: 2, BackoffMin: time.Second, BackoffMax: 10 * time.Second}) {
		t.Fatalf("%+v %v", got, err)
	}
	req.Meta.Labels = map[string]string{LabelRetryBackoffMin: "3s"}
	if got, err := RetryPolicyOf(req, topic); err != nil ||
		got != (RetryPolicy{MaxAttempts: 5, BackoffMin: 3 * time.Second, BackoffMax: time.Minute}) {
		t.Fatalf("backoff_min label: %+v %v", got, err)
	}
	// Every job's policy is read this way, three times: none allocates.
	plain := &capv1.JobRequest{Meta: &capv1.JobMetadata{Labels: map[string]string{"team": "a"}}}
	if n := testing.AllocsPerRun(100, func() { _, _ = RetryPolicyOf(plain, topic) }); n != 0 {
		t.Errorf("RetryPolicyOf allocates %v for a request without retry labels, want 0", n)
	}
	for _, bad := range []map[string]string{{LabelRetryAttempts: "x"}, {LabelRetryAttempts: "101"},
		{LabelRetryBackoffMin: "soon"}, {LabelRetryBackoffMin: "2m"}} {
		req := &capv1.JobRequest{Meta: &capv1.JobMetadata{Labels: bad}}
		if _, err := RetryPolicyOf(req, topic); !errors.Is(err, ErrRetryPolicy) {
			t.Errorf("%v: %v, want ErrRetryPolicy", bad, err)
		}
	}
}
