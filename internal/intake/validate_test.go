package intake_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/intake"
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
		"env tenant with a newline": {func(r *capv1.JobRequest) { r.Env = map[string]string{"tenant_id": "a\nb"} }, "env.tenant_id"},
		"env tenant too long": {func(r *capv1.JobRequest) {
			r.Env = map[string]string{"tenant_id": strings.Repeat("t", intake.MaxIDLength+1)}
		}, "env.tenant_id"},
		"labels too big together": {func(r *capv1.JobRequest) {
			r.Labels = manyEntries(intake.MaxLabelBytes/intake.MaxLabelValue+1, intake.MaxLabelValue)
		}, "labels"},
		"env too big together": {func(r *capv1.JobRequest) {
			r.Env = map[string]string{"A": strings.Repeat("a", intake.MaxEnvBytes/2+1), "B": strings.Repeat("b", intake.MaxEnvBytes/2)}
		}, "env"},
		"request too big": {func(r *capv1.JobRequest) { r.ContextPtr = strings.Repeat("c", intake.MaxRequestBytes) }, "request"},
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

// An env tenant_id is only a tenant when tenant_id is empty: then it is
// validated; otherwise it is an env value like any other.
func TestEnvTenantValidatedOnlyWhenItIsTheTenant(t *testing.T) {
	t.Parallel()
	r := base()
	r.TenantId, r.Env = "acme", map[string]string{"tenant_id": "{not an id}"}
	if err := intake.ValidateRequest(r); err != nil {
		t.Fatalf("env tenant_id beside tenant_id: %v", err)
	}
}

func TestValidateHeartbeat(t *testing.T) {
	t.Parallel()
	ok := func() *capv1.Heartbeat {
		return &capv1.Heartbeat{WorkerId: "w-1", Pool: "gpu-a100", Region: "eu", Type: "cpu",
			Labels: map[string]string{"dispatch": "direct"}, Capabilities: []string{"echo"}}
	}
	if err := intake.ValidateHeartbeat(ok()); err != nil {
		t.Fatalf("a plain heartbeat: %v", err)
	}
	if err := intake.ValidateHeartbeat(&capv1.Heartbeat{WorkerId: "w-1"}); err != nil {
		t.Fatalf("a heartbeat without a pool: %v", err)
	}
	cases := map[string]struct {
		mutate func(*capv1.Heartbeat)
		says   string
	}{
		"worker id with a dot":  {func(h *capv1.Heartbeat) { h.WorkerId = "a.b" }, "worker_id"},
		"pool too long":         {func(h *capv1.Heartbeat) { h.Pool = strings.Repeat("p", intake.MaxPoolName+1) }, "pool"},
		"pool with a brace":     {func(h *capv1.Heartbeat) { h.Pool = "p{x}" }, "pool"},
		"pool with a newline":   {func(h *capv1.Heartbeat) { h.Pool = "p\n" }, "pool"},
		"region with a newline": {func(h *capv1.Heartbeat) { h.Region = "eu\n" }, "region"},
		"type too long":         {func(h *capv1.Heartbeat) { h.Type = strings.Repeat("t", intake.MaxHeartbeatField+1) }, "type"},
		"too many labels":       {func(h *capv1.Heartbeat) { h.Labels = manyEntries(intake.MaxHeartbeatLabels+1, 1) }, "labels"},
		"label value too long": {func(h *capv1.Heartbeat) {
			h.Labels = map[string]string{"k": strings.Repeat("v", intake.MaxHeartbeatField+1)}
		}, "labels"},
		"too many capabilities": {func(h *capv1.Heartbeat) { h.Capabilities = make([]string, intake.MaxCapabilities+1) }, "capabilities"},
		"capability with a tab": {func(h *capv1.Heartbeat) { h.Capabilities = []string{"a\tb"} }, "capabilities"},
	}
	for name, c := range cases {
		h := ok()
		c.mutate(h)
		err := intake.ValidateHeartbeat(h)
		if !errors.Is(err, intake.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v (want ErrInvalid naming %s)", name, err, c.says)
		}
	}
	// An invalid id is quoted clipped, not whole, in the error.
	h := ok()
	h.Pool = strings.Repeat("p", 100_000) + "}"
	if err := intake.ValidateHeartbeat(h); err == nil || len(err.Error()) > 1024 {
		t.Fatalf("error of %d bytes", len(err.Error()))
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
