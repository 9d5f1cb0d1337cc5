package router

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// The pools file's retries section gives each topic its retry policy; a
// bad entry is refused with its line.
func TestRetryPolicyPoolsFileSection(t *testing.T) {
	cfg, err := ParsePools([]byte("topics:\n  job.x: a\nretries:\n  job.x: {attempts: 5, backoff_min: 100ms, backoff_max: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := jobstate.RetryPolicy{MaxAttempts: 5, BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second}
	if got := cfg.Retries["job.x"]; got != want {
		t.Fatalf("policy %+v, want %+v", got, want)
	}
	for _, bad := range []string{
		"  job.x: {attempts: many}\n",
		"  job.x: {attempts: 500}\n",
		"  job.x: {backoff_min: 2s, backoff_max: 1s}\n",
		"  job.x: {jitter: 1}\n",
		"  job.x: 3\n",
	} {
		_, err := ParsePools([]byte("topics:\n  job.x: a\nretries:\n" + bad))
		var pe *PoolsError
		if !errors.As(err, &pe) || pe.Line != 4 || !strings.Contains(err.Error(), "retries.job.x") {
			t.Errorf("%q: %v, want an error at line 4 naming retries.job.x", bad, err)
		}
	}
}
