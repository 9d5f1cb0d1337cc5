package jobstate

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// Retry policies: how often, and after how long, a job whose worker failed
// it is run again. The job's core (internal/lifecycle) decides; this is the
// policy's data and its parsing, shared by the core, the node's config and
// intake.

// RetryPolicy is a job's retry policy. MaxAttempts ≤ 1 means no retry (the
// job runs once, as without a policy).
type RetryPolicy struct {
	// MaxAttempts counts every run, the first included.
	MaxAttempts int
	// BackoffMin is the wait before the second attempt; each later wait
	// doubles, up to BackoffMax. The wait is jittered down by up to half
	// (see RetryPolicy.Backoff).
	BackoffMin, BackoffMax time.Duration
}

// Retry policy defaults and bounds.
const (
	RetryBackoffMinDefault = time.Second
	RetryBackoffMaxDefault = time.Minute
	// RetryMaxAttemptsLimit bounds MaxAttempts: past it a job that keeps
	// failing is a bug to look at, not a transient fault.
	RetryMaxAttemptsLimit = 100
	// RetryBackoffLimit bounds BackoffMax: the wait is held in the node's
	// memory (a timer) and in the due set; a wait of more than a day is a
	// schedule, not a retry.
	RetryBackoffLimit = 24 * time.Hour
)

// The labels a job's request sets its own retry policy with, in
// meta.labels (JobRequest.labels are placement constraints), overriding its
// topic's: labels rather than new CAP fields, so every CAP client can set
// them today.
const (
	LabelRetryAttempts   = "troupe.retry.attempts"    // "5"
	LabelRetryBackoffMin = "troupe.retry.backoff_min" // "100ms" (Go duration)
	LabelRetryBackoffMax = "troupe.retry.backoff_max" // "1s"
)

// ErrRetryPolicy wraps every invalid retry policy.
var ErrRetryPolicy = errors.New("invalid retry policy")

// Retries reports whether the policy runs a job more than once.
func (p RetryPolicy) Retries() bool { return p.MaxAttempts > 1 }

// Validate checks p's bounds.
func (p RetryPolicy) Validate() error {
	switch {
	case p.MaxAttempts < 0 || p.MaxAttempts > RetryMaxAttemptsLimit:
		return fmt.Errorf("%w: attempts %d not in 0..%d", ErrRetryPolicy, p.MaxAttempts, RetryMaxAttemptsLimit)
	case p.BackoffMin < 0 || p.BackoffMax < 0:
		return fmt.Errorf("%w: negative backoff", ErrRetryPolicy)
	case p.BackoffMax > RetryBackoffLimit:
		return fmt.Errorf("%w: backoff_max %s over %s", ErrRetryPolicy, p.BackoffMax, RetryBackoffLimit)
	case p.BackoffMax > 0 && p.BackoffMin > p.BackoffMax:
		return fmt.Errorf("%w: backoff_min %s over backoff_max %s", ErrRetryPolicy, p.BackoffMin, p.BackoffMax)
	}
	return nil
}

// withDefaults fills an unset backoff.
func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.BackoffMin <= 0 {
		p.BackoffMin = RetryBackoffMinDefault
	}
	if p.BackoffMax <= 0 {
		p.BackoffMax = max(RetryBackoffMaxDefault, p.BackoffMin)
	}
	if p.BackoffMin > p.BackoffMax {
		p.BackoffMin = p.BackoffMax
	}
	return p
}

// Backoff is the wait before attempt next (≥ 2): BackoffMin·2^(next−2),
// capped at BackoffMax, less a jitter of up to half of it taken from rnd
// (any random number), so retries of jobs that failed together spread out.
func (p RetryPolicy) Backoff(next int, rnd uint64) time.Duration {
	p = p.withDefaults()
	d := p.BackoffMax
	if shift := next - 2; shift >= 0 && shift < 40 {
		if b := p.BackoffMin << shift; b > 0 && b < d {
			d = b
		}
	}
	if half := uint64(d / 2); half > 0 {
		d -= time.Duration(rnd % (half + 1))
	}
	return d
}

// RetryPolicyOf is req's retry policy: topic's (the node's config),
// overridden field by field by the request's labels. A label that does not
// parse is an error (intake refuses the submit with it).
func RetryPolicyOf(req *capv1.JobRequest, topic RetryPolicy) (RetryPolicy, error) {
	p := topic
	if v, ok := retryLabel(req, LabelRetryAttempts); ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return topic, fmt.Errorf("%w: label %s=%q is not a number", ErrRetryPolicy, LabelRetryAttempts, clip(v))
		}
		p.MaxAttempts = n
	}
	// By index, not through pointers into p: a pointer kept in a table
	// moved p to the heap, an allocation per call (three a job).
	for i, key := range [...]string{LabelRetryBackoffMin, LabelRetryBackoffMax} {
		if v, ok := retryLabel(req, key); ok {
			d, err := time.ParseDuration(strings.TrimSpace(v))
			if err != nil {
				return topic, fmt.Errorf("%w: label %s=%q is not a duration", ErrRetryPolicy, key, clip(v))
			}
			if i == 0 {
				p.BackoffMin = d
			} else {
				p.BackoffMax = d
			}
		}
	}
	if err := p.Validate(); err != nil {
		return topic, err
	}
	return p, nil
}

func retryLabel(req *capv1.JobRequest, key string) (string, bool) {
	v, ok := req.GetMeta().GetLabels()[key]
	return v, ok
}

func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}

// Attempt ids. A job that may run more than once is dispatched under an id
// of its attempt, "<job_id>~a<n>": the worker's result and progress name the
// attempt, so an earlier attempt's answer cannot end a later one, and a CAP
// client waiting on sys.job.result for <job_id> hears only the one outcome
// the node publishes when the job is final. '~' is not allowed in a job id,
// so no submitted id reads as an attempt id.

// AttemptSep separates a job id from its attempt number.
const AttemptSep = "~a"

// AttemptID is the id attempt n of job id is dispatched under.
func AttemptID(id string, n int) string { return id + AttemptSep + strconv.Itoa(n) }

// SplitAttempt reads an id a worker answered with: the job's id and the
// attempt (0: a plain job id, no attempt named).
func SplitAttempt(id string) (string, int) {
	i := strings.LastIndex(id, AttemptSep)
	if i <= 0 {
		return id, 0
	}
	digits := id[i+len(AttemptSep):]
	if len(digits) == 0 || len(digits) > 4 || digits[0] == '0' {
		return id, 0
	}
	n := 0
	for _, c := range []byte(digits) {
		if c < '0' || c > '9' {
			return id, 0
		}
		n = n*10 + int(c-'0')
	}
	return id[:i], n
}

// Record fields of a job's attempts.
const (
	// FieldTry is the attempt the job is on (missing: 1).
	FieldTry = "try"
	// FieldRetryAt is when a job waiting to be retried is run again (unix ms).
	FieldRetryAt = "retry_at"
	// FieldAttemptErr prefixes the error of a failed attempt that was
	// retried: "te<n>" = "<error_code>: <message>", clipped to
	// AttemptErrMax bytes (record values stay within Redis's compact
	// encoding).
	FieldAttemptErr = "te"
	AttemptErrMax   = 60
)

// AttemptErr is the value of FieldAttemptErr for a failed attempt.
func AttemptErr(code, msg string) string {
	s := code
	if msg != "" {
		if s != "" {
			s += ": "
		}
		s += msg
	}
	if len(s) > AttemptErrMax {
		s = s[:AttemptErrMax]
	}
	return s
}
