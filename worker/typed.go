package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobdata"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Error codes of the results Typed sends for jobs fn never ran or could
// not answer.
const (
	codeBadInput  = "bad_input"
	codeNoResult  = "result_not_stored"
	codeFailed    = "failed"
	codeFailFatal = "failed_fatal"
)

// fatalError marks an error as not worth a retry (FAILED_FATAL).
type fatalError struct{ err error }

func (e fatalError) Error() string { return e.err.Error() }
func (e fatalError) Unwrap() error { return e.err }

// Fatal marks err as fatal: a Typed handler that returns it ends the job
// FAILED_FATAL (which rolls back the job's workflow, when it is a step of
// one), not FAILED.
func Fatal(err error) error { return fatalError{err} }

// Typed adapts fn to a Handler with typed arguments: the job's input — the
// value its context_ptr points at, in rdb (CAP's Redis convention: the
// node's Redis) — is decoded from JSON into In (a job without one gets
// In's zero value); fn's Out is encoded as JSON and stored as the job's
// result (res:<job_id>, kept for ttl; 0: 48 h), which the result's
// result_ptr points at. An error
// from fn ends the job FAILED with its message (FAILED_FATAL if wrapped
// with Fatal); an input that does not decode ends it FAILED_FATAL with code
// bad_input, since running it again would not help.
func Typed[In, Out any](rdb redis.UniversalClient, ttl time.Duration, fn func(context.Context, In) (Out, error)) Handler {
	data := &jobdata.Store{Client: rdb, TTL: ttl}
	return func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		var in In
		if ptr := req.GetContextPtr(); ptr != "" {
			raw, err := data.Get(ctx, ptr)
			if err == nil {
				err = json.Unmarshal(raw, &in)
			}
			if err != nil {
				return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED_FATAL, ErrorCode: codeBadInput,
					ErrorMessage: fmt.Sprintf("input %s: %v", ptr, err)}
			}
		}
		out, err := fn(ctx, in)
		if err != nil {
			res := &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED, ErrorCode: codeFailed, ErrorMessage: err.Error()}
			var fe fatalError
			if errors.As(err, &fe) {
				res.Status, res.ErrorCode = capv1.JobStatus_JOB_STATUS_FAILED_FATAL, codeFailFatal
			}
			return res
		}
		raw, err := json.Marshal(out)
		var ptr string
		if err == nil {
			ptr, err = data.PutResult(ctx, req.GetJobId(), raw)
		}
		if err != nil {
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED, ErrorCode: codeNoResult, ErrorMessage: err.Error()}
		}
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: ptr}
	}
}
