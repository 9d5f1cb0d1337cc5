package safety_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

func TestApplyConstraints(t *testing.T) {
	t.Parallel()
	c := &capv1.PolicyConstraints{RedactionLevel: "strict",
		Budgets: &capv1.BudgetConstraints{MaxRuntimeMs: 2000, MaxArtifactBytes: 1024, MaxConcurrentJobs: 3, MaxRetries: 2},
		Sandbox: &capv1.SandboxProfile{Isolated: true}}
	for _, tc := range []struct {
		name           string
		budget         *capv1.Budget
		wantDeadlineMs int64
	}{
		{"a later deadline is lowered", &capv1.Budget{DeadlineMs: 5000, MaxInputTokens: 7}, 2000},
		{"an earlier deadline stays", &capv1.Budget{DeadlineMs: 1000}, 1000},
		{"no deadline gets the runtime", nil, 2000},
	} {
		req := &capv1.JobRequest{JobId: "j", Budget: tc.budget}
		safety.ApplyConstraints(req, c)
		if req.Budget.DeadlineMs != tc.wantDeadlineMs {
			t.Errorf("%s: deadline %d", tc.name, req.Budget.DeadlineMs)
		}
		var got capv1.PolicyConstraints
		if err := protojson.Unmarshal([]byte(req.Env[safety.EnvPolicyConstraints]), &got); err != nil || !proto.Equal(&got, c) {
			t.Errorf("%s: constraints env %q %v", tc.name, req.Env[safety.EnvPolicyConstraints], err)
		}
		if req.Env[safety.EnvRedactionLevel] != "strict" || req.Env[safety.EnvMaxArtifactBytes] != "1024" ||
			req.Env[safety.EnvMaxConcurrentJobs] != "3" || req.Env[safety.EnvMaxRetries] != "2" {
			t.Errorf("%s: env %v", tc.name, req.Env)
		}
	}
	req := &capv1.JobRequest{JobId: "j", Env: map[string]string{"K": "V"}}
	safety.ApplyConstraints(req, &capv1.PolicyConstraints{Sandbox: &capv1.SandboxProfile{Isolated: true}})
	if req.Budget != nil || req.Env[safety.EnvMaxRetries] != "" || req.Env["K"] != "V" || req.Env[safety.EnvPolicyConstraints] == "" {
		t.Errorf("zero limits written: %v %v", req.Env, req.Budget)
	}
	safety.ApplyConstraints(req, nil) // no constraints: nothing to do
}

func TestDecisionFields(t *testing.T) {
	t.Parallel()
	e, _ := loadTestPolicy(t)
	resp, _ := e.Check(t.Context(), req("job.db.drop", "acme"))
	f := strings.Join(safety.DecisionFields(resp), "|")
	for _, w := range []string{"policy_decision|deny", "rule_id|block-prod-delete", "policy_snapshot|v7:", "policy_remediations|{",
		"use-archive"} {
		if !strings.Contains(f, w) {
			t.Errorf("fields %q lack %q", f, w)
		}
	}
}
