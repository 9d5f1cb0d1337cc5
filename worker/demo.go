package worker

import (
	"context"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// Env entries of a JobRequest the demo handlers (Demo) honour, so that a
// user can make one job fail, fail fatally or take its time from the CLI
// (`troupe submit --env demo.fail=1`). Env, not labels: a job's labels
// constrain which worker takes it.
const (
	// envFail: any value but "" or "0" ends the job FAILED (the node writes
	// a DLQ entry).
	envFail = "demo.fail"
	// envFatal: ends the job FAILED_FATAL, which rolls back its workflow
	// (saga) when it is a workflow's step.
	envFatal = "demo.fatal"
	// envSleep: a Go duration ("2s") the job takes before its outcome.
	envSleep = "demo.sleep"
	// envError: the error message of a failure (default "demo failure").
	envError = "demo.error"
)

// Fail ends every job FAILED, or with fatal FAILED_FATAL.
func Fail(fatal bool) Handler {
	return func(_ context.Context, req *capv1.JobRequest) *capv1.JobResult {
		return failure(req, fatal)
	}
}

func failure(req *capv1.JobRequest, fatal bool) *capv1.JobResult {
	msg := req.GetEnv()[envError]
	if msg == "" {
		msg = "demo failure"
	}
	st, code := capv1.JobStatus_JOB_STATUS_FAILED, "demo_failed"
	if fatal {
		st, code = capv1.JobStatus_JOB_STATUS_FAILED_FATAL, "demo_failed_fatal"
	}
	return &capv1.JobResult{Status: st, ErrorCode: code, ErrorMessage: msg}
}

func envOn(req *capv1.JobRequest, key string) bool {
	v := req.GetEnv()[key]
	return v != "" && v != "0" && v != "false"
}

// Demo wraps next with the per-job demo switches (envFail, envFatal,
// envSleep): a job without them runs next as it is. A sleep that its
// context ends first ends the job CANCELLED.
func Demo(next Handler) Handler {
	return func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		if d, err := time.ParseDuration(req.GetEnv()[envSleep]); err == nil && d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_CANCELLED, ErrorMessage: ctx.Err().Error()}
			}
		}
		switch {
		case envOn(req, envFatal):
			return failure(req, true)
		case envOn(req, envFail):
			return failure(req, false)
		}
		return next(ctx, req)
	}
}
