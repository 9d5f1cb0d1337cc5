package worker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobdata"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

type point struct{ X, Y int }

// Typed decodes the job's input, stores its answer as the job's result,
// and turns errors and bad input into FAILED and FAILED_FATAL.
func TestTypedDecodesTheInputAndStoresTheResult(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	st := &jobdata.Store{Client: env.Client, TTL: time.Minute}
	id := func(n string) string {
		id := env.Prefix + "-" + n
		t.Cleanup(func() { env.Client.Del(ctx, "ctx:"+id, "res:"+id) })
		return id
	}
	h := worker.Typed(env.Client, time.Minute, func(_ context.Context, p point) (int, error) {
		switch {
		case p.X < 0:
			return 0, errors.New("negative")
		case p.Y < 0:
			return 0, worker.Fatal(errors.New("never"))
		}
		return p.X + p.Y, nil
	})
	run := func(name, input string) (*capv1.JobResult, string) {
		jid := id(name)
		ptr, err := st.PutInput(ctx, jid, []byte(input))
		if err != nil {
			t.Fatal(err)
		}
		return h(ctx, &capv1.JobRequest{JobId: jid, ContextPtr: ptr}), jid
	}
	res, jid := run("ok", `{"X": 2, "Y": 3}`)
	got, err := st.Get(ctx, res.ResultPtr)
	if res.Status != capv1.JobStatus_JOB_STATUS_SUCCEEDED || res.ResultPtr != jobdata.ResultPointer(jid) || err != nil ||
		string(got) != "5" {
		t.Fatalf("ok: %v, result %q %v", res, got, err)
	}
	if ttl := env.Client.TTL(ctx, "res:"+jid).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("result TTL %s, want the store's minute", ttl)
	}
	for _, c := range []struct {
		name, input string
		status      capv1.JobStatus
		code        string
	}{
		{"fail", `{"X": -1}`, capv1.JobStatus_JOB_STATUS_FAILED, worker.CodeFailed},
		{"fatal", `{"Y": -1}`, capv1.JobStatus_JOB_STATUS_FAILED_FATAL, worker.CodeFailFatal},
		{"bad", `{"X": "two"}`, capv1.JobStatus_JOB_STATUS_FAILED_FATAL, worker.CodeBadInput},
	} {
		if res, _ := run(c.name, c.input); res.Status != c.status || res.ErrorCode != c.code || res.ResultPtr != "" {
			t.Errorf("%s: %v, want %s %s", c.name, res, c.status, c.code)
		}
	}
	// No input: the zero value.
	if res := h(ctx, &capv1.JobRequest{JobId: id("none")}); res.Status != capv1.JobStatus_JOB_STATUS_SUCCEEDED {
		t.Fatalf("no input: %v", res)
	}
}

// The demo switches in a job's env decide its outcome.
func TestDemoHonoursTheJobsEnv(t *testing.T) {
	h := worker.Demo(worker.Echo)
	for env, want := range map[string]capv1.JobStatus{
		"":                   capv1.JobStatus_JOB_STATUS_SUCCEEDED,
		worker.EnvFail:       capv1.JobStatus_JOB_STATUS_FAILED,
		worker.EnvFatal:      capv1.JobStatus_JOB_STATUS_FAILED_FATAL,
		worker.EnvFail + "0": capv1.JobStatus_JOB_STATUS_SUCCEEDED,
	} {
		req := &capv1.JobRequest{JobId: "d", Env: map[string]string{}}
		switch env {
		case worker.EnvFail + "0":
			req.Env[worker.EnvFail] = "0"
		case "":
		default:
			req.Env[env] = "1"
		}
		if res := h(context.Background(), req); res.Status != want {
			t.Errorf("env %q: %s, want %s", env, res.Status, want)
		}
	}
	// A sleep longer than the job's context: cancelled, not failed.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req := &capv1.JobRequest{JobId: "s", Env: map[string]string{worker.EnvSleep: "1h", worker.EnvFail: "1"}}
	if res := h(ctx, req); res.Status != capv1.JobStatus_JOB_STATUS_CANCELLED {
		t.Fatalf("sleep cut short: %s", res.Status)
	}
	if res := worker.Fail(false)(context.Background(), &capv1.JobRequest{}); res.Status != capv1.JobStatus_JOB_STATUS_FAILED ||
		res.ErrorMessage != "demo failure" {
		t.Fatalf("Fail: %v", res)
	}
}
