package intake

import (
	"errors"
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// A submit whose retry labels do not parse is invalid (dead-lettered as
// invalid_request); a result or progress may name an attempt of a job,
// and names that job; a submit may not use an attempt id.
func TestRetryPolicyIDsAndLabelsAtIntake(t *testing.T) {
	req := &capv1.JobRequest{JobId: "job-1", Topic: "job.x",
		Meta: &capv1.JobMetadata{Labels: map[string]string{jobstate.LabelRetryAttempts: "lots"}}}
	if err := ValidateRequest(req); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad retry label: %v", err)
	}
	if err := ValidateEventJobID("job-1~a3"); err != nil || JobOf("job-1~a3") != "job-1" {
		t.Fatalf("attempt id: %v, job %q", err, JobOf("job-1~a3"))
	}
	if err := ValidateRequest(&capv1.JobRequest{JobId: "job-1~a3", Topic: "job.x"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a submit under an attempt id: %v", err)
	}
}
