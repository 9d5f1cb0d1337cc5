package policyenv_test

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/policyenv"
	"github.com/troupe-run/troupe/proto/capv1"
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
		policyenv.ApplyConstraints(req, c)
		if req.Budget.DeadlineMs != tc.wantDeadlineMs {
			t.Errorf("%s: deadline %d", tc.name, req.Budget.DeadlineMs)
		}
		var got capv1.PolicyConstraints
		if err := protojson.Unmarshal([]byte(req.Env[policyenv.EnvPolicyConstraints]), &got); err != nil || !proto.Equal(&got, c) {
			t.Errorf("%s: constraints env %q %v", tc.name, req.Env[policyenv.EnvPolicyConstraints], err)
		}
		if req.Env[policyenv.EnvRedactionLevel] != "strict" || req.Env[policyenv.EnvMaxArtifactBytes] != "1024" ||
			req.Env[policyenv.EnvMaxConcurrentJobs] != "3" || req.Env[policyenv.EnvMaxRetries] != "2" {
			t.Errorf("%s: env %v", tc.name, req.Env)
		}
	}
	req := &capv1.JobRequest{JobId: "j", Env: map[string]string{"K": "V"}}
	policyenv.ApplyConstraints(req, &capv1.PolicyConstraints{Sandbox: &capv1.SandboxProfile{Isolated: true}})
	if req.Budget != nil || req.Env[policyenv.EnvMaxRetries] != "" || req.Env["K"] != "V" || req.Env[policyenv.EnvPolicyConstraints] == "" {
		t.Errorf("zero limits written: %v %v", req.Env, req.Budget)
	}
	policyenv.ApplyConstraints(req, nil) // no constraints: nothing to do
}
