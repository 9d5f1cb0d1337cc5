package safety_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/troupe-run/troupe/internal/outputgate"
	"github.com/troupe-run/troupe/internal/policyx"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

const (
	oAllow      = capv1.OutputDecision_OUTPUT_DECISION_ALLOW
	oQuarantine = capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE
	oDeny       = capv1.OutputDecision_OUTPUT_DECISION_DENY
	oRedact     = capv1.OutputDecision_OUTPUT_DECISION_REDACT
)

// Sample secrets and PII. None is real: the AWS key is AWS's documented
// example, the card number a test number.
const (
	samplePEM      = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1234\nabcd\n-----END RSA PRIVATE KEY-----"
	sampleAWSKey   = "AKIAIOSFODNN7EXAMPLE"
	sampleAWSSec   = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	sampleGCPKey   = "AIzaSyA1234567890abcdefghijklmnopqrstuv"
	sampleGitHub   = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
	sampleSlack    = "xoxb-1234567890-abcdefghij"
	sampleBearer   = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln"
	sampleEmail    = "bob.smith+x@example.co.uk"
	sampleCard     = "4111 1111 1111 1111"
	sampleBadCard  = "4111-1111-1111-1112"
	sampleURLPass  = "s3cr3t"
	outputTestYAML = `
version: o1
rules:
  - id: internal
    match: {topics: ["job.internal.*"]}
    decision: allow
  - id: failed-acme
    match: {has_error: true, tenants: [acme]}
    decision: quarantine
    reason: failed acme jobs are reviewed
  - id: banned
    match: {labels: {export: banned}}
    decision: deny
  - id: customer
    match: {topics: ["job.customer.*"]}
    decision: redact
limits: {max_artifacts: 2, max_result_bytes: 1000, decision: deny}
scanners:
  secrets: {decision: quarantine}
  pii: {enabled: true, decision: redact, detectors: [email, phone, credit_card]}
`
)

func outReq(topic, tenant, ptr string, opts ...func(*capv1.OutputCheckRequest)) *capv1.OutputCheckRequest {
	r := &capv1.OutputCheckRequest{JobId: "job-1", Topic: topic, Tenant: tenant, Labels: map[string]string{},
		Result: &capv1.JobResult{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: ptr}}
	for _, o := range opts {
		o(r)
	}
	return r
}

func outputPolicy(t testing.TB) *safety.OutputPolicy {
	t.Helper()
	p, err := safety.ParseOutputPolicy([]byte(outputTestYAML))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Every detector finds its kind and redacts only the sensitive part.
func TestOutputDetectors(t *testing.T) {
	t.Parallel()
	all, err := safety.ParseOutputPolicy([]byte(`
scanners:
  secrets: {decision: redact}
  pii: {enabled: true, decision: redact}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, text, redacted string
	}{
		{"private key", "key:\n" + samplePEM + "\nend", "key:\n[REDACTED:private_key]\nend"},
		{"truncated private key", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk", "[REDACTED:private_key]"},
		{"aws access key", "id=" + sampleAWSKey + ";", "id=[REDACTED:aws_access_key];"},
		{"aws secret key", "aws_secret_access_key = " + sampleAWSSec, "aws_secret_access_key = [REDACTED:aws_secret_key]"},
		{"gcp api key", "k=" + sampleGCPKey, "k=[REDACTED:gcp_api_key]"},
		{"github token", "token " + sampleGitHub + " end", "token [REDACTED:github_token] end"},
		{"slack token", "slack " + sampleSlack, "slack [REDACTED:slack_token]"},
		{"bearer token", "Authorization: Bearer " + sampleBearer, "Authorization: Bearer [REDACTED:bearer_token]"},
		{"password in url", "postgres://admin:" + sampleURLPass + "@db.internal:5432/app", "postgres://admin:[REDACTED:url_password]@db.internal:5432/app"},
		{"email", "mail " + sampleEmail + " today", "mail [REDACTED:email] today"},
		{"two addresses in one token", "cc:a@example.com,b@example.org;", "cc:[REDACTED:email],[REDACTED:email];"},
		{"e.164 phone", "call +4915123456789.", "call [REDACTED:phone]."},
		{"nanp phone", "call (555) 123-4567 or 555-123-4567", "call [REDACTED:phone] or [REDACTED:phone]"},
		{"card passing luhn", "card " + sampleCard + " ok", "card [REDACTED:credit_card] ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := all.ScanContent(context.Background(), outReq("job.x", "beta", "redis://res:1"), []byte(tc.text))
			if err != nil {
				t.Fatal(err)
			}
			if v.Decision != oRedact || len(v.Findings) == 0 {
				t.Fatalf("decision %v findings %v", v.Decision, v.Findings)
			}
			if string(v.Redacted) != tc.redacted {
				t.Fatalf("redacted %q, want %q", v.Redacted, tc.redacted)
			}
			for _, f := range v.Findings {
				if f.Where != "content" || f.Len == 0 {
					t.Fatalf("finding %+v", f)
				}
			}
		})
	}
	for _, clean := range []string{
		"nothing to see", "date 2024-01-15, version 1.2.3, ip 10.0.0.1", "card " + sampleBadCard,
		"https://example.com/path@v2", "AKIA-not-a-key", "bearer short", "user@localhost",
		"-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----",
	} {
		v, err := all.ScanContent(context.Background(), outReq("job.x", "beta", "redis://res:1"), []byte(clean))
		if err != nil || v.Decision != oAllow {
			t.Errorf("%q: %v %v", clean, v.Decision, v.Findings)
		}
	}
}

func TestOutputCheckMetaDecisions(t *testing.T) {
	t.Parallel()
	p := outputPolicy(t)
	withErr := func(r *capv1.OutputCheckRequest) { r.Result.ErrorCode, r.Result.ErrorMessage = "x", "boom" }
	for _, tc := range []struct {
		name     string
		req      *capv1.OutputCheckRequest
		decision capv1.OutputDecision
		rule     string
		where    string
	}{
		{"clean metadata", outReq("job.x", "beta", "redis://res:job-1"), oAllow, "", ""},
		{"rule allows without scanning", outReq("job.internal.x", "beta", "s3://u:"+sampleURLPass+"@b/k"), oAllow, "internal", ""},
		{"rule on error fields and tenant", outReq("job.x", "ACME", "redis://res:job-1", withErr), oQuarantine, "failed-acme", ""},
		{"error rule needs an error", outReq("job.x", "acme", "redis://res:job-1"), oAllow, "", ""},
		{"rule on labels", outReq("job.x", "beta", "", func(r *capv1.OutputCheckRequest) { r.Labels["export"] = "banned" }), oDeny, "banned", ""},
		{"rule decides redact", outReq("job.customer.report", "beta", "redis://res:job-1"), oRedact, "customer", ""},
		{"too many artifacts", outReq("job.x", "beta", "", func(r *capv1.OutputCheckRequest) { r.Result.ArtifactPtrs = []string{"a", "b", "c"} }),
			oDeny, "limits:max_artifacts", ""},
		{"password in the result pointer", outReq("job.x", "beta", "s3://u:"+sampleURLPass+"@bucket/k"), oQuarantine, "scanner:secrets", "result_ptr"},
		{"secret in an artifact pointer", outReq("job.x", "beta", "", func(r *capv1.OutputCheckRequest) {
			r.Result.ArtifactPtrs = []string{"redis://a", "https://x/?key=" + sampleAWSKey}
		}), oQuarantine, "scanner:secrets", "artifact_ptrs[1]"},
		{"a redacting scanner quarantines metadata it cannot redact", outReq("job.x", "beta", "", func(r *capv1.OutputCheckRequest) {
			r.Result.ErrorMessage = "could not mail " + sampleEmail
		}), oQuarantine, "scanner:pii", "error_message"},
		{"the job's own labels are not scanned", outReq("job.x", "beta", "", func(r *capv1.OutputCheckRequest) { r.Labels["owner"] = sampleEmail }),
			oAllow, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := p.CheckMeta(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if v.Decision != tc.decision || v.RuleID != tc.rule {
				t.Fatalf("got %v by %q (%s), want %v by %q", v.Decision, v.RuleID, v.Reason, tc.decision, tc.rule)
			}
			if !strings.HasPrefix(v.PolicySnapshot, "output:o1:") || v.Reason == "" {
				t.Fatalf("snapshot %q reason %q", v.PolicySnapshot, v.Reason)
			}
			if tc.where != "" && (len(v.Findings) == 0 || v.Findings[0].Where != tc.where) {
				t.Fatalf("findings %+v, want one in %s", v.Findings, tc.where)
			}
			if strings.Contains(v.Reason, sampleURLPass) || strings.Contains(v.Reason, sampleEmail) {
				t.Fatalf("reason leaks the secret: %q", v.Reason)
			}
		})
	}
}

func TestOutputScanContentDecisions(t *testing.T) {
	t.Parallel()
	p := outputPolicy(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		req      *capv1.OutputCheckRequest
		content  string
		decision capv1.OutputDecision
		rule     string
		redacted string
	}{
		{"clean", outReq("job.x", "beta", "p"), `{"ok":true}`, oAllow, "", ""},
		{"secret quarantines", outReq("job.x", "beta", "p"), "key " + sampleAWSKey, oQuarantine, "scanner:secrets", ""},
		{"pii redacts", outReq("job.x", "beta", "p"), "to " + sampleEmail, oRedact, "scanner:pii", "to [REDACTED:email]"},
		{"the strictest finding wins", outReq("job.x", "beta", "p"), sampleEmail + " " + sampleAWSKey, oQuarantine, "scanner:secrets", ""},
		{"over the size limit", outReq("job.x", "beta", "p"), strings.Repeat("a", 1001), oDeny, "limits:max_result_bytes", ""},
		{"a redact rule redacts secrets too", outReq("job.customer.x", "beta", "p"), "k=" + sampleAWSKey + " m=" + sampleEmail, oRedact, "customer",
			"k=[REDACTED:aws_access_key] m=[REDACTED:email]"},
		{"a redact rule with nothing to redact", outReq("job.customer.x", "beta", "p"), "clean", oAllow, "customer", ""},
		{"an allow rule skips the scan", outReq("job.internal.x", "beta", "p"), sampleAWSKey, oAllow, "internal", ""},
		{"a deny rule holds in phase 2 too", outReq("job.x", "beta", "p", func(r *capv1.OutputCheckRequest) { r.Labels["export"] = "banned" }), "clean", oDeny, "banned", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := p.ScanContent(ctx, tc.req, []byte(tc.content))
			if err != nil {
				t.Fatal(err)
			}
			if v.Decision != tc.decision || v.RuleID != tc.rule {
				t.Fatalf("got %v by %q (%s), want %v by %q", v.Decision, v.RuleID, v.Reason, tc.decision, tc.rule)
			}
			if string(v.Redacted) != tc.redacted {
				t.Fatalf("redacted %q, want %q", v.Redacted, tc.redacted)
			}
		})
	}
	// The scan respects its budget.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.ScanContent(cctx, outReq("job.x", "beta", "p"), []byte("x")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled scan: %v", err)
	}
}

func TestDefaultOutputPolicy(t *testing.T) {
	t.Parallel()
	p := safety.DefaultOutputPolicy()
	ctx := context.Background()
	if v, _ := p.ScanContent(ctx, outReq("job.x", "t", "p"), []byte(samplePEM)); v.Decision != oQuarantine {
		t.Fatalf("default secrets scanner: %v", v.Decision)
	}
	if v, _ := p.ScanContent(ctx, outReq("job.x", "t", "p"), []byte(sampleEmail)); v.Decision != oAllow {
		t.Fatalf("PII is off by default: %v", v.Decision)
	}
	if v, _ := p.ScanContent(ctx, outReq("job.x", "t", "p"), make([]byte, safety.OutputMaxResultBytesDefault+1)); v.Decision != oQuarantine {
		t.Fatalf("oversize: %v", v.Decision)
	}
}

func TestParseOutputPolicyRejectsWithTheLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml string
		line       int
		msg        string
	}{
		{"unknown key", "version: x\nscaners: {}\n", 2, `unknown key "scaners"`},
		{"unknown scanner key", "scanners:\n  secrets:\n    mode: on\n", 3, `unknown key "mode"`},
		{"unknown detector", "scanners:\n  pii:\n    detectors: [email, ssn]\n", 3, `unknown detector "ssn"`},
		{"bad rule decision", "rules:\n  - id: a\n    decision: shred\n", 3, `decision "shred"`},
		{"allow is no scanner decision", "scanners:\n  secrets:\n    decision: allow\n", 3, "want quarantine, deny or redact"},
		{"redact is no limit decision", "limits:\n  decision: redact\n", 2, "want quarantine or deny"},
		{"negative limit", "limits:\n  max_artifacts: -1\n", 2, "must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := safety.ParseOutputPolicy([]byte(tc.yaml))
			var pe *safety.PolicyError
			if !errors.Is(err, safety.ErrInvalidPolicy) || !errors.As(err, &pe) {
				t.Fatalf("err %v", err)
			}
			if pe.Line != tc.line || !strings.Contains(pe.Msg, tc.msg) {
				t.Fatalf("line %d msg %q, want %d %q", pe.Line, pe.Msg, tc.line, tc.msg)
			}
		})
	}
}

// Not parallel: it sets the environment.
func TestOutputConfigFromEnv(t *testing.T) {
	t.Setenv(policyx.EnvOutputEnabled, "true")
	t.Setenv(policyx.EnvOutputFile, "")
	t.Setenv(policyx.EnvOutputAddr, "")
	cfg, err := policyx.OutputConfigFromEnv()
	if err != nil || cfg.Enabled == nil || !*cfg.Enabled {
		t.Fatalf("cfg %+v %v", cfg, err)
	}
	c, err := policyx.NewOutputChecker(cfg)
	if err != nil || c == nil {
		t.Fatalf("enabled without a file: %v %v", c, err)
	}
	off := false
	if c, _ := policyx.NewOutputChecker(policyx.OutputConfig{Enabled: &off}); c != nil {
		t.Fatal("disabled checker built")
	}
	if c, _ := policyx.NewOutputChecker(policyx.OutputConfig{}); c != nil {
		t.Fatal("no file, no env: output checking should be off")
	}
}

// resultBundle is a Redis result store with one result written under the
// test's prefix.
type resultBundle struct {
	env   *testenv.Env
	store *safety.RedisResultStore
}

func setupResults(t *testing.T) *resultBundle {
	t.Helper()
	env := testenv.New(t)
	return &resultBundle{env: env, store: &safety.RedisResultStore{Client: env.Redis}}
}

// put stores content as a worker would and returns its pointer.
func (b *resultBundle) put(t *testing.T, name, content string) string {
	t.Helper()
	key := b.env.KeyPrefix() + "res:" + name
	if err := b.env.Redis.Set(context.Background(), key, content, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	return safety.RedisPointerPrefix + key
}

func (b *resultBundle) get(t *testing.T, ptr string) string {
	t.Helper()
	v, err := b.env.Redis.Get(context.Background(), strings.TrimPrefix(ptr, safety.RedisPointerPrefix)).Result()
	if err != nil {
		t.Fatalf("%s: %v", ptr, err)
	}
	return v
}

func TestOutputGateBuiltIn(t *testing.T) {
	t.Parallel()
	b := setupResults(t)
	reg := prometheus.NewRegistry()
	m, err := outputgate.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	g := &outputgate.Gate{Checker: outputPolicy(t), Results: b.store, Metrics: m}
	ctx := context.Background()

	t.Run("phase 1 allow", func(t *testing.T) {
		ptr := b.put(t, "allow", "fine")
		o := g.Phase1(ctx, outReq("job.x", "beta", ptr))
		if o.Decision != oAllow || o.Quarantine || o.ResultPtr != ptr || o.ContentChecked {
			t.Fatalf("%+v", o)
		}
	})
	t.Run("phase 1 quarantine and deny", func(t *testing.T) {
		o := g.Phase1(ctx, outReq("job.x", "beta", "s3://u:"+sampleURLPass+"@b/k"))
		if o.Decision != oQuarantine || !o.Quarantine {
			t.Fatalf("%+v", o)
		}
		o = g.Phase1(ctx, outReq("job.x", "beta", "", func(r *capv1.OutputCheckRequest) { r.Labels["export"] = "banned" }))
		if o.Decision != oDeny || !o.Quarantine {
			t.Fatalf("%+v", o)
		}
	})
	t.Run("phase 1 redact stores a copy and swaps the pointer", func(t *testing.T) {
		ptr := b.put(t, "redact", "mail "+sampleEmail)
		o := g.Phase1(ctx, outReq("job.customer.x", "beta", ptr))
		if o.Decision != oRedact || o.Quarantine || !o.Redacted || o.ResultPtr != ptr+":redacted" || !o.ContentChecked {
			t.Fatalf("%+v", o)
		}
		if got := b.get(t, o.ResultPtr); got != "mail [REDACTED:email]" {
			t.Fatalf("stored copy %q", got)
		}
		if got := b.get(t, ptr); got != "mail "+sampleEmail {
			t.Fatal("the original was changed")
		}
		ttl, _ := b.env.Redis.PTTL(ctx, strings.TrimPrefix(o.ResultPtr, "redis://")).Result()
		if ttl <= 0 || ttl > time.Hour {
			t.Fatalf("redacted copy TTL %v, want the original's", ttl)
		}
		f := strings.Join(o.Fields(), " ")
		for _, w := range []string{"output_meta_decision redact", "output_meta_redacted_ptr " + o.ResultPtr, "output_meta_findings 1 email"} {
			if !strings.Contains(f, w) {
				t.Fatalf("fields %q lack %q", f, w)
			}
		}
	})
	t.Run("phase 1 redact with nothing to redact releases the original", func(t *testing.T) {
		ptr := b.put(t, "clean", "clean")
		o := g.Phase1(ctx, outReq("job.customer.x", "beta", ptr))
		if o.Decision != oAllow || o.Quarantine || o.Redacted || o.ResultPtr != ptr {
			t.Fatalf("%+v", o)
		}
	})
	t.Run("phase 1 redact without a copy quarantines", func(t *testing.T) {
		for _, o := range []outputgate.Outcome{
			g.Phase1(ctx, outReq("job.customer.x", "beta", b.env.KeyPrefix()+"not-a-pointer")),
			g.Phase1(ctx, outReq("job.customer.x", "beta", "redis://"+b.env.KeyPrefix()+"res:missing")),
			g.Phase1(ctx, outReq("job.customer.x", "beta", "")),
			(&outputgate.Gate{Checker: outputPolicy(t)}).Phase1(ctx, outReq("job.customer.x", "beta", "redis://x")),
		} {
			if !o.Quarantine || o.Decision != oQuarantine || !strings.Contains(o.Reason, "quarantined:") {
				t.Fatalf("%+v", o)
			}
		}
	})
	t.Run("phase 2 quarantine", func(t *testing.T) {
		ptr := b.put(t, "secret", samplePEM)
		o := g.Phase2(ctx, outReq("job.x", "beta", ptr))
		if o.Decision != oQuarantine || !o.Quarantine || o.ResultPtr != ptr {
			t.Fatalf("%+v", o)
		}
	})
	t.Run("phase 2 redact", func(t *testing.T) {
		ptr := b.put(t, "pii", "card "+sampleCard)
		o := g.Phase2(ctx, outReq("job.x", "beta", ptr))
		if o.Decision != oRedact || o.Quarantine || o.ResultPtr != ptr+":redacted" {
			t.Fatalf("%+v", o)
		}
		if got := b.get(t, o.ResultPtr); got != "card [REDACTED:credit_card]" {
			t.Fatalf("stored copy %q", got)
		}
	})
	t.Run("phase 2 skips what it cannot read, without quarantining", func(t *testing.T) {
		o := g.Phase2(ctx, outReq("job.x", "beta", "redis://"+b.env.KeyPrefix()+"res:gone"))
		if o.Skipped != "fetch_failed" || o.Quarantine || !errors.Is(o.Err, safety.ErrNoResult) {
			t.Fatalf("%+v", o)
		}
		o = g.Phase2(ctx, outReq("job.x", "beta", ""))
		if o.Skipped != "no_pointer" || o.Quarantine {
			t.Fatalf("%+v", o)
		}
	})
	if n := counterValue(t, reg, "troupe_output_policy_skipped_total", "why", "fetch_failed"); n != 1 {
		t.Fatalf("skipped fetch_failed = %v", n)
	}
	if n := counterValue(t, reg, "troupe_output_policy_checked_total", "decision", "redact"); n < 2 {
		t.Fatalf("checked redact = %v", n)
	}
}

// A checker that fails lets the result through (fail open) and is counted.
func TestOutputGateFailsOpen(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, _ := outputgate.NewMetrics(reg)
	b := setupResults(t)
	g := &outputgate.Gate{Checker: brokenChecker{}, Results: b.store, Metrics: m}
	ptr := b.put(t, "r", "content")
	for _, o := range []outputgate.Outcome{g.Phase1(context.Background(), outReq("job.x", "t", ptr)),
		g.Phase2(context.Background(), outReq("job.x", "t", ptr))} {
		if o.Decision != oAllow || o.Quarantine || o.Err == nil || o.ResultPtr != ptr {
			t.Fatalf("%+v", o)
		}
	}
	if n := counterValue(t, reg, "troupe_output_policy_checked_total", "decision", "error"); n != 2 {
		t.Fatalf("checked error = %v", n)
	}
}

type brokenChecker struct{}

func (brokenChecker) CheckMeta(context.Context, *capv1.OutputCheckRequest) (*safety.OutputVerdict, error) {
	return nil, errors.New("checker broken")
}

func (brokenChecker) ScanContent(context.Context, *capv1.OutputCheckRequest, []byte) (*safety.OutputVerdict, error) {
	return nil, errors.New("checker broken")
}

// The external OutputPolicy service, served by Troupe's OutputServer and
// called through the remote checker: decisions, and redacted copies the
// service stores itself.
func TestRemoteOutputChecker(t *testing.T) {
	t.Parallel()
	b := setupResults(t)
	addr := serve(t, nil, func(s *grpc.Server) {
		capv1.RegisterOutputPolicyServer(s, policyx.NewOutputServer(outputPolicy(t), b.store))
	})
	remote, err := policyx.NewRemoteOutputChecker(policyx.RemoteOutputConfig{Addr: addr, MetaTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	g := &outputgate.Gate{Checker: remote} // no Results: the service reads content itself
	ctx := context.Background()

	o := g.Phase1(ctx, outReq("job.x", "beta", "", func(r *capv1.OutputCheckRequest) { r.Labels["export"] = "banned" }))
	if o.Decision != oDeny || !o.Quarantine || o.RuleID != "banned" || !strings.HasPrefix(o.Snapshot, "output:o1:") {
		t.Fatalf("phase 1: %+v", o)
	}
	ptr := b.put(t, "remote-pii", "mail "+sampleEmail)
	o = g.Phase2(ctx, outReq("job.x", "beta", ptr))
	if o.Decision != oRedact || !o.Redacted || o.ResultPtr != ptr+":redacted" {
		t.Fatalf("phase 2 redact: %+v", o)
	}
	if got := b.get(t, o.ResultPtr); got != "mail [REDACTED:email]" {
		t.Fatalf("stored copy %q", got)
	}
	ptr = b.put(t, "remote-secret", "id "+sampleAWSKey)
	if o = g.Phase2(ctx, outReq("job.x", "beta", ptr)); !o.Quarantine {
		t.Fatalf("phase 2 secret: %+v", o)
	}
	// Phase 1 REDACT from the service: the gate has the service redact
	// the content (its content phase) and swaps the pointer...
	ptr = b.put(t, "remote-customer", "id "+sampleAWSKey)
	o = g.Phase1(ctx, outReq("job.customer.x", "beta", ptr))
	if o.Quarantine || !o.Redacted || o.ResultPtr != ptr+":redacted" || !o.ContentChecked {
		t.Fatalf("phase 1 redact: %+v", o)
	}
	if got := b.get(t, o.ResultPtr); got != "id [REDACTED:aws_access_key]" {
		t.Fatalf("stored copy %q", got)
	}
	// ...and with no pointer there is nothing to copy: quarantined.
	if o = g.Phase1(ctx, outReq("job.customer.x", "beta", "")); !o.Quarantine {
		t.Fatalf("phase 1 redact without content: %+v", o)
	}

	// A service without content access refuses phase 2: no decision, fail open.
	addr2 := serve(t, nil, func(s *grpc.Server) {
		capv1.RegisterOutputPolicyServer(s, policyx.NewOutputServer(outputPolicy(t), nil))
	})
	remote2, _ := policyx.NewRemoteOutputChecker(policyx.RemoteOutputConfig{Addr: addr2})
	defer remote2.Close()
	o = (&outputgate.Gate{Checker: remote2}).Phase2(ctx, outReq("job.x", "beta", ptr))
	if o.Quarantine || o.Err == nil || o.Decision != oAllow {
		t.Fatalf("phase 2 without content access: %+v", o)
	}
}
