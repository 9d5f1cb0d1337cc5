package intake_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/troupe-run/troupe/bus"
	"github.com/troupe-run/troupe/intake"
	"github.com/troupe-run/troupe/proto/capv1"
)

func base() *capv1.JobRequest { return &capv1.JobRequest{JobId: "job-1", Topic: "job.echo"} }

func manyEntries(n, valueLen int) map[string]string {
	m := map[string]string{}
	for i := 0; len(m) < n; i++ {
		m["k"+strings.Repeat("x", i)] = strings.Repeat("v", valueLen)
	}
	return m
}

// Each limit rejects with ErrInvalid and names what it broke.
func TestValidateRequestLimits(t *testing.T) {
	t.Parallel()
	if err := intake.ValidateRequest(base()); err != nil {
		t.Fatalf("a plain request: %v", err)
	}
	cases := map[string]struct {
		mutate func(*capv1.JobRequest)
		says   string
	}{
		"job id with a wildcard": {func(r *capv1.JobRequest) { r.JobId = "a.>" }, "job_id"},
		"job id with a space":    {func(r *capv1.JobRequest) { r.JobId = "a b" }, "job_id"},
		"job id too long":        {func(r *capv1.JobRequest) { r.JobId = strings.Repeat("a", intake.MaxIDLength+1) }, "job_id"},
		"topic missing":          {func(r *capv1.JobRequest) { r.Topic = "" }, "topic"},
		"topic with a wildcard":  {func(r *capv1.JobRequest) { r.Topic = "job.*" }, "topic"},
		"topic with empty token": {func(r *capv1.JobRequest) { r.Topic = "job..x" }, "topic"},
		"topic too long": {func(r *capv1.JobRequest) {
			r.Topic = "job." + strings.Repeat("a", intake.MaxTopicLength)
		}, "topic"},
		"topic with a control char": {func(r *capv1.JobRequest) { r.Topic = "job.\x01" }, "topic"},
		"tenant with a space":       {func(r *capv1.JobRequest) { r.TenantId = "acme corp" }, "tenant_id"},
		"too many labels":           {func(r *capv1.JobRequest) { r.Labels = manyEntries(intake.MaxLabels+1, 1) }, "labels"},
		"label value too long": {func(r *capv1.JobRequest) {
			r.Labels = map[string]string{"k": strings.Repeat("v", intake.MaxLabelValue+1)}
		}, "labels"},
		"label key with a newline": {func(r *capv1.JobRequest) { r.Labels = map[string]string{"a\nb": "v"} }, "labels"},
		"too many env entries":     {func(r *capv1.JobRequest) { r.Env = manyEntries(intake.MaxEnv+1, 1) }, "env"},
		"env value too long": {func(r *capv1.JobRequest) {
			r.Env = map[string]string{"K": strings.Repeat("v", intake.MaxEnvValue+1)}
		}, "env"},
		"meta label key too long": {func(r *capv1.JobRequest) {
			r.Meta = &capv1.JobMetadata{Labels: map[string]string{strings.Repeat("k", intake.MaxLabelKey+1): "v"}}
		}, "meta.labels"},
		"idempotency key too long": {func(r *capv1.JobRequest) {
			r.Meta = &capv1.JobMetadata{IdempotencyKey: strings.Repeat("i", intake.MaxIdempotencyKey+1)}
		}, "idempotency_key"},
	}
	for name, c := range cases {
		r := base()
		c.mutate(r)
		err := intake.ValidateRequest(r)
		if !errors.Is(err, intake.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v (want ErrInvalid naming %s)", name, err, c.says)
		}
	}
}

// No input, however malformed, makes decoding or validation panic, and a
// rejection always has a reason.
func FuzzDecodeAndValidate(f *testing.F) {
	for _, seed := range [][]byte{nil, {0xff, 0xff}, []byte("not a packet")} {
		f.Add(seed)
	}
	good, _ := bus.EncodeRequest("t", "s", &capv1.JobRequest{JobId: "job-1", Topic: "job.echo",
		Labels: map[string]string{"a": "b"}, Env: map[string]string{"K": "V"}, Meta: &capv1.JobMetadata{IdempotencyKey: "k"}})
	f.Add(good)
	res, _ := bus.EncodeResult("t", "w", &capv1.JobResult{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED})
	f.Add(res)
	f.Fuzz(func(t *testing.T, data []byte) {
		pkt, err := bus.Decode(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("decode error without a message")
			}
			return
		}
		if req := pkt.GetJobRequest(); req != nil {
			if err := intake.ValidateRequest(req); err != nil &&
				(!errors.Is(err, intake.ErrInvalid) || err.Error() == "") {
				t.Fatalf("validation error not classified: %v", err)
			}
		}
		if r := pkt.GetJobResult(); r != nil {
			_ = intake.ValidateJobID(r.JobId)
		}
		if hb := pkt.GetHeartbeat(); hb != nil {
			_ = intake.ValidateWorkerID(hb.WorkerId)
		}
	})
}
