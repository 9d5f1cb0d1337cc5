package safety_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

const (
	allow     = capv1.DecisionType_DECISION_TYPE_ALLOW
	deny      = capv1.DecisionType_DECISION_TYPE_DENY
	human     = capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN
	throttle  = capv1.DecisionType_DECISION_TYPE_THROTTLE
	allowWith = capv1.DecisionType_DECISION_TYPE_ALLOW_WITH_CONSTRAINTS
)

func loadTestPolicy(t testing.TB) (*safety.Engine, []byte) {
	t.Helper()
	data, err := os.ReadFile("testdata/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e, err := safety.NewEngine(data)
	if err != nil {
		t.Fatal(err)
	}
	return e, data
}

// req builds a check request; opts edit it.
func req(topic, tenant string, opts ...func(*capv1.PolicyCheckRequest)) *capv1.PolicyCheckRequest {
	r := &capv1.PolicyCheckRequest{JobId: "job-1", Topic: topic, Tenant: tenant, Labels: map[string]string{},
		Meta: &capv1.JobMetadata{}}
	for _, o := range opts {
		o(r)
	}
	return r
}

func labels(kv ...string) func(*capv1.PolicyCheckRequest) {
	return func(r *capv1.PolicyCheckRequest) {
		for i := 0; i+1 < len(kv); i += 2 {
			r.Labels[kv[i]] = kv[i+1]
		}
	}
}

func meta(f func(m *capv1.JobMetadata)) func(*capv1.PolicyCheckRequest) {
	return func(r *capv1.PolicyCheckRequest) { f(r.Meta) }
}

func TestEngineDecisions(t *testing.T) {
	t.Parallel()
	e, data := loadTestPolicy(t)
	sum := sha256.Sum256(data)
	snapshot := "v7:" + hex.EncodeToString(sum[:])
	for _, tc := range []struct {
		name     string
		req      *capv1.PolicyCheckRequest
		decision capv1.DecisionType
		rule     string
	}{
		{"topics outside job.* are denied before any rule", req("sys.admin", "acme"), deny, safety.RuleNonJobTopic},
		{"an empty topic is denied", req("", "acme"), deny, safety.RuleNonJobTopic},
		{"tenant and topic list match", req("job.db.drop", "acme"), deny, "block-prod-delete"},
		{"tenant match ignores case", req("job.db.delete", "ACME"), deny, "block-prod-delete"},
		{"another tenant falls through to the default allow", req("job.db.drop", "beta"), allow, safety.RuleDefaultAllow},
		{"secrets_present label needs a human", req("job.x", "beta", labels("secrets_present", "true")), human, "secrets-need-human"},
		{"secrets_present=false does not", req("job.x", "beta", labels("secrets_present", "false")), allow, safety.RuleDefaultAllow},
		{"mcp call on the allow list", req("job.mcp.call", "beta", labels("mcp.server", "github", "mcp.tool", "list_prs")), allow, "mcp-trusted"},
		{"mcp lists ignore case", req("job.mcp.call", "beta", labels("mcp.server", "JIRA")), allow, "mcp-trusted"},
		{"mcp denied tool falls to the next rule", req("job.mcp.call", "beta", labels("mcp.server", "github", "mcp.tool", "delete_repo")), deny, "mcp-other"},
		{"mcp server off the allow list", req("job.mcp.call", "beta", labels("mcp.server", "evil")), deny, "mcp-other"},
		{"no mcp call passes the mcp condition", req("job.mcp.call", "beta"), allow, "mcp-trusted"},
		{"any risk tag matches, ignoring case", req("job.x", "beta", meta(func(m *capv1.JobMetadata) { m.RiskTags = []string{"low", "pii"} })), human, "risky-human"},
		{"requires must all be present", req("job.train.llm", "beta", meta(func(m *capv1.JobMetadata) { m.Requires = []string{"docker", "GPU", "cuda"} })), throttle, "gpu-throttle"},
		{"requires partly present", req("job.train.llm", "beta", meta(func(m *capv1.JobMetadata) { m.Requires = []string{"gpu"} })), allow, safety.RuleDefaultAllow},
		// path.Match's * stops only at '/', so job.train.* also matches
		// job.train.a.b, as in every kernel that uses path.Match
		// (CAP-WIRE.md says otherwise; the reference code does this).
		{"path.Match star crosses dots", req("job.train.a.b", "beta", meta(func(m *capv1.JobMetadata) { m.Requires = []string{"gpu", "cuda"} })), throttle, "gpu-throttle"},
		{"a literal topic pattern matches only itself", req("job.echo.more", ""), allow, safety.RuleDefaultAllow},
		{"allow with constraints", req("job.run", "beta", meta(func(m *capv1.JobMetadata) {
			m.Capability, m.ActorType = "code.exec", capv1.ActorType_ACTOR_TYPE_SERVICE
		})), allowWith, "sandboxed-code"},
		{"actor type must match", req("job.run", "beta", meta(func(m *capv1.JobMetadata) {
			m.Capability, m.ActorType = "code.exec", capv1.ActorType_ACTOR_TYPE_HUMAN
		})), allow, safety.RuleDefaultAllow},
		{"explicit allow_with_constraints", req("job.run", "beta", meta(func(m *capv1.JobMetadata) { m.PackId = "Pack-A" })), allowWith, "pack-a-basic"},
		{"actor id and full enum actor type", req("job.run", "beta", meta(func(m *capv1.JobMetadata) {
			m.ActorId, m.ActorType = "alice", capv1.ActorType_ACTOR_TYPE_HUMAN
		})), deny, "suspended-human"},
		{"label equality", req("job.batch.nightly", "beta", labels("lane", "batch")), throttle, "batch-lane"},
		{"label values are case-sensitive", req("job.batch.nightly", "beta", labels("lane", "Batch")), allow, safety.RuleDefaultAllow},
		{"literal topic", req("job.echo", ""), allow, "echo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := e.Check(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Decision != tc.decision || resp.RuleId != tc.rule {
				t.Fatalf("got %v by %q (%s), want %v by %q", resp.Decision, resp.RuleId, resp.Reason, tc.decision, tc.rule)
			}
			if resp.PolicySnapshot != snapshot {
				t.Fatalf("snapshot %q, want %q", resp.PolicySnapshot, snapshot)
			}
			if resp.Reason == "" {
				t.Fatal("empty reason")
			}
			if (resp.Decision == human) != resp.ApprovalRequired {
				t.Fatalf("approval_required %v for %v", resp.ApprovalRequired, resp.Decision)
			}
			if resp.ApprovalRequired && resp.ApprovalRef != tc.req.JobId {
				t.Fatalf("approval_ref %q, want the job id", resp.ApprovalRef)
			}
		})
	}
}

func TestEngineConstraintsAndRemediations(t *testing.T) {
	t.Parallel()
	e, _ := loadTestPolicy(t)
	resp, _ := e.Check(context.Background(), req("job.run", "beta", meta(func(m *capv1.JobMetadata) {
		m.Capability, m.ActorType = "code.exec", capv1.ActorType_ACTOR_TYPE_SERVICE
	})))
	want := &capv1.PolicyConstraints{
		Budgets:        &capv1.BudgetConstraints{MaxRuntimeMs: 60000, MaxRetries: 1, MaxArtifactBytes: 1 << 20, MaxConcurrentJobs: 4},
		Sandbox:        &capv1.SandboxProfile{Isolated: true, NetworkAllowlist: []string{"pypi.org"}, FsReadOnly: []string{"/data"}, FsReadWrite: []string{"/tmp"}},
		Toolchain:      &capv1.ToolchainConstraints{AllowedTools: []string{"python"}, AllowedCommands: []string{"pytest"}},
		Diff:           &capv1.DiffConstraints{MaxFiles: 10, MaxLines: 500, DenyPathGlobs: []string{"*.pem"}},
		RedactionLevel: "strict",
	}
	if !proto.Equal(resp.Constraints, want) {
		t.Fatalf("constraints %v, want %v", resp.Constraints, want)
	}
	// A caller editing its copy must not change the policy.
	resp.Constraints.Budgets.MaxRuntimeMs = 1
	again, _ := e.Check(context.Background(), req("job.run", "beta", meta(func(m *capv1.JobMetadata) {
		m.Capability, m.ActorType = "code.exec", capv1.ActorType_ACTOR_TYPE_SERVICE
	})))
	if again.Constraints.Budgets.MaxRuntimeMs != 60000 {
		t.Fatal("a response edit leaked into the policy")
	}

	resp, _ = e.Check(context.Background(), req("job.db.drop", "acme"))
	if len(resp.Remediations) != 1 {
		t.Fatalf("remediations %v", resp.Remediations)
	}
	rm := resp.Remediations[0]
	if rm.Id != "use-archive" || rm.ReplacementTopic != "job.db.archive" || rm.ReplacementCapability != "db.archive" ||
		rm.AddLabels["archived"] != "true" || len(rm.RemoveLabels) != 1 || rm.Title == "" || rm.Summary == "" {
		t.Fatalf("remediation %v", rm)
	}
	if resp.Reason != "destructive database jobs are not allowed for acme" {
		t.Fatalf("reason %q", resp.Reason)
	}
}

func TestEngineExplainSaysWhichRuleAndWhy(t *testing.T) {
	t.Parallel()
	e, _ := loadTestPolicy(t)
	ctx := context.Background()
	for _, tc := range []struct {
		req  *capv1.PolicyCheckRequest
		want []string
	}{
		{req("job.db.drop", "acme"), []string{"rule block-prod-delete matched:", "tenant acme", "topic job.db.drop ~ job.db.drop",
			"(destructive database jobs are not allowed for acme)"}},
		{req("job.mcp.call", "beta", labels("mcp.server", "evil")), []string{"rule mcp-other matched:", "topic job.mcp.call ~ job.mcp.*"}},
		{req("job.train.x", "beta", meta(func(m *capv1.JobMetadata) { m.Requires = []string{"gpu", "cuda"} })),
			[]string{"rule gpu-throttle matched:", "requires ⊇ gpu,cuda"}},
		{req("job.nothing", ""), []string{"no rule matched (11 rules checked, tenant default, topic job.nothing); default allow"}},
		{req("sys.x", ""), []string{"outside job.*"}},
	} {
		resp, err := e.Explain(ctx, tc.req)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !strings.Contains(resp.Reason, w) {
				t.Errorf("%s: reason %q lacks %q", tc.req.Topic, resp.Reason, w)
			}
		}
		check, _ := e.Check(ctx, tc.req)
		if check.Decision != resp.Decision || check.RuleId != resp.RuleId {
			t.Errorf("%s: explain decided %v/%s, check %v/%s", tc.req.Topic, resp.Decision, resp.RuleId, check.Decision, check.RuleId)
		}
	}
}

func TestEngineLegacyTenants(t *testing.T) {
	t.Parallel()
	e, err := safety.NewEngine([]byte(`
default_tenant: acme
tenants:
  acme:
    allow_topics: ["job.*"]
    deny_topics: ["job.danger", "job.admin.*"]
    max_concurrent_jobs: 5
    allowed_repo_hosts: [github.com]
    mcp: {allow_servers: [github], deny_tools: [rm]}
  beta:
    allow_topics: ["job.beta.*"]
`))
	if err != nil {
		t.Fatal(err)
	}
	p := e.Policy()
	if !p.Legacy || p.Rules() != 5 { // acme: 2 deny, mcp, 1 allow; beta: 1 allow
		t.Fatalf("legacy %v with %d rules", p.Legacy, p.Rules())
	}
	if l := p.TenantLimits(); len(l) != 1 || l["acme"] != 5 {
		t.Fatalf("tenant limits %v", l)
	}
	for _, tc := range []struct {
		req      *capv1.PolicyCheckRequest
		decision capv1.DecisionType
		rule     string
	}{
		{req("job.danger", "acme"), deny, "legacy:acme:deny:1"},
		{req("job.admin.reset", "acme"), deny, "legacy:acme:deny:2"},
		{req("job.x", "acme"), allowWith, "legacy:acme:allow:1"},
		{req("job.x", ""), allowWith, "legacy:acme:allow:1"}, // default_tenant
		{req("job.x", "acme", labels("mcp.server", "evil")), deny, "legacy:acme:mcp"},
		{req("job.x", "acme", labels("mcp.server", "github", "mcp.tool", "rm")), deny, "legacy:acme:mcp"},
		{req("job.x", "acme", labels("mcp.server", "github", "mcp.tool", "ls")), allowWith, "legacy:acme:allow:1"},
		{req("job.beta.run", "beta"), allow, "legacy:beta:allow:1"},
		{req("job.other", "beta"), allow, safety.RuleDefaultAllow}, // CAP: no match allows
		{req("sys.x", "beta"), deny, safety.RuleNonJobTopic},
	} {
		resp, _ := e.Check(context.Background(), tc.req)
		if resp.Decision != tc.decision || resp.RuleId != tc.rule {
			t.Errorf("%s/%s: got %v by %q, want %v by %q", tc.req.Tenant, tc.req.Topic, resp.Decision, resp.RuleId, tc.decision, tc.rule)
		}
		if resp.Decision == allowWith && resp.Constraints.GetBudgets().GetMaxConcurrentJobs() != 5 {
			t.Errorf("%s: constraints %v", tc.req.Topic, resp.Constraints)
		}
	}

	// With rules present, tenants are validated but not used.
	e, err = safety.NewEngine([]byte(`
rules: [{id: only, match: {topics: [job.z]}, decision: deny}]
tenants: {acme: {deny_topics: [job.x]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if resp, _ := e.Check(context.Background(), req("job.x", "acme")); resp.Decision != allow {
		t.Fatalf("legacy rules applied beside rules: %v", resp)
	}
}

func TestPolicySnapshotNamesTheContent(t *testing.T) {
	t.Parallel()
	a, _ := safety.ParsePolicy([]byte("rules: []\n"))
	b, _ := safety.ParsePolicy([]byte("rules: [] # a comment is a change\n"))
	c, _ := safety.ParsePolicy([]byte("version: v2\nrules: []\n"))
	if a.Snapshot == b.Snapshot || len(a.Snapshot) != 64 {
		t.Fatalf("snapshots %q %q", a.Snapshot, b.Snapshot)
	}
	if !strings.HasPrefix(c.Snapshot, "v2:") || len(c.Snapshot) != 3+64 {
		t.Fatalf("versioned snapshot %q", c.Snapshot)
	}
	empty, err := safety.ParsePolicy(nil)
	if err != nil || empty.Rules() != 0 {
		t.Fatalf("empty policy: %v %v", empty, err)
	}
}

func TestParsePolicyRejectsWithTheLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml string
		line       int
		msg        string
	}{
		{"unknown top-level key", "version: v1\nrulez: []\n", 2, `unknown key "rulez"`},
		{"unknown match key", "rules:\n  - id: a\n    match:\n      topic: [job.x]\n    decision: deny\n", 4, `unknown key "topic"`},
		{"unknown constraints key", "rules:\n  - id: a\n    decision: allow\n    constraints:\n      budgets: {max_runtime: 5}\n", 5, `unknown key "max_runtime"`},
		{"unknown tenant key", "tenants:\n  acme:\n    allow_topic: [job.x]\n", 3, `unknown key "allow_topic"`},
		{"unknown mcp key", "rules:\n  - id: a\n    decision: deny\n    match: {mcp: {allow_server: [x]}}\n", 4, `unknown key "allow_server"`},
		{"bad decision", "rules:\n  - id: a\n    decision: maybe\n", 3, `unknown decision "maybe"`},
		{"missing decision", "rules:\n  - id: a\n    match: {topics: [job.x]}\n", 2, "decision is required"},
		{"bad topic pattern", "rules:\n  - id: a\n    decision: deny\n    match:\n      topics:\n        - job.[x\n", 6, "topic pattern"},
		{"duplicate id", "rules:\n  - {id: a, decision: deny}\n  - {id: a, decision: allow}\n", 3, `id "a" already used`},
		{"negative budget", "rules:\n  - id: a\n    decision: allow\n    constraints:\n      budgets:\n        max_runtime_ms: -1\n", 6, "must not be negative"},
		{"bad actor type", "rules:\n  - id: a\n    decision: deny\n    match:\n      actor_types: [robot]\n", 5, `unknown actor type "robot"`},
		{"wrong type", "rules:\n  - id: a\n    decision: deny\n    match: {secrets_present: maybe}\n", 4, "cannot unmarshal"},
		{"bad legacy pattern", "tenants:\n  acme:\n    deny_topics:\n      - \"job.[\"\n", 4, "bad topic pattern"},
		{"syntax error", "rules: [\n", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := safety.ParsePolicy([]byte(tc.yaml))
			if !errors.Is(err, safety.ErrInvalidPolicy) {
				t.Fatalf("err %v, want ErrInvalidPolicy", err)
			}
			var pe *safety.PolicyError
			if !errors.As(err, &pe) {
				t.Fatalf("err %T", err)
			}
			if tc.line > 0 && pe.Line != tc.line {
				t.Errorf("line %d, want %d (%v)", pe.Line, tc.line, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q lacks %q", err, tc.msg)
			}
		})
	}
}

func TestEngineReloadKeepsOldVersionOnInvalidFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "policy.yaml")
	write := func(s string) {
		t.Helper()
		// Write beside and rename, as config management does, so the
		// watcher never reads a half-written file.
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("version: one\nrules: [{id: a, match: {topics: [job.x]}, decision: deny}]\n")
	type reload struct {
		p   *safety.Policy
		err error
	}
	reloads := make(chan reload, 8)
	e, err := safety.StartEngine(safety.EngineConfig{Path: file, Poll: 10 * time.Millisecond,
		OnReload: func(p *safety.Policy, err error) { reloads <- reload{p, err} }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	wait := func() reload {
		t.Helper()
		select {
		case r := <-reloads:
			return r
		case <-time.After(5 * time.Second):
			t.Fatal("no reload")
		}
		return reload{}
	}
	first := e.Policy().Snapshot
	if d, _ := e.Check(context.Background(), req("job.x", "")); d.Decision != deny {
		t.Fatalf("initial policy not in force: %v", d)
	}

	write("version: two\nrules: [{id: a, match: {topics: [job.x]}, decision: allow}]\n")
	r := wait()
	if r.err != nil || !strings.HasPrefix(r.p.Snapshot, "two:") {
		t.Fatalf("reload: %v %v", r.p.Snapshot, r.err)
	}
	if d, _ := e.Check(context.Background(), req("job.x", "")); d.Decision != allow || d.PolicySnapshot != r.p.Snapshot {
		t.Fatalf("new policy not in force: %v", d)
	}
	second := r.p.Snapshot

	write("version: three\nrules: [{id: a, match: {topics: [job.x]}, decision: deny, colour: red}]\n")
	r = wait()
	var pe *safety.PolicyError
	if !errors.As(r.err, &pe) || pe.Line != 2 || !strings.Contains(pe.Msg, "colour") {
		t.Fatalf("invalid file: %v", r.err)
	}
	if e.Policy().Snapshot != second || r.p.Snapshot != second {
		t.Fatalf("invalid file replaced the policy: %s", e.Policy().Snapshot)
	}
	if d, _ := e.Check(context.Background(), req("job.x", "")); d.Decision != allow {
		t.Fatalf("old version not kept: %v", d)
	}

	// Back to the first content: a known version is listed once.
	write("version: one\nrules: [{id: a, match: {topics: [job.x]}, decision: deny}]\n")
	if r = wait(); r.err != nil || r.p.Snapshot != first {
		t.Fatalf("reload to first: %v %v", r.p.Snapshot, r.err)
	}
	if got := e.Snapshots(); len(got) != 2 || got[0] != second || got[1] != first {
		t.Fatalf("snapshots %v", got)
	}

	// Reload on demand with nothing changed is a no-op.
	if err := e.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestStartEngineRefusesInvalidFile(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(file, []byte("rules:\n  - id: a\n    decison: deny\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := safety.LoadEngine(file)
	if !errors.Is(err, safety.ErrInvalidPolicy) || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("err %v", err)
	}
	if _, err := safety.LoadEngine(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
}
