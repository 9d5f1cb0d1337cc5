package safety_test

import (
	"context"
	"testing"

	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// No policy file makes the engine panic, while loading or while deciding; a
// rejected file always says why, and an accepted one always decides.
func FuzzPolicyEngine(f *testing.F) {
	for _, seed := range []string{
		"version: v1\nrules:\n  - id: r1\n    match: {topics: [\"job.*\"], labels: {k: v}}\n    decision: deny\n",
		"tenants:\n  default: {allow_topics: [\"job.*\"], deny_topics: [\"sys.*\"], max_concurrent_jobs: 2}\n",
		"rules:\n  - id: c\n    match: {topics: [\"job.[\"]}\n    decision: allow\n    constraints: {budgets: {max_runtime_ms: 5}}\n",
		"rules: 5\n", "", "rules:\n  - {}\n",
	} {
		f.Add([]byte(seed), "job.x", "acme")
	}
	f.Fuzz(func(t *testing.T, data []byte, topic, tenant string) {
		e, err := safety.NewEngine(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("rejection without a reason")
			}
			return
		}
		dec, err := e.Check(context.Background(), &capv1.PolicyCheckRequest{JobId: "j", Topic: topic, Tenant: tenant,
			Labels: map[string]string{"mcp.server": "s"}})
		if err != nil || dec == nil || dec.Decision == capv1.DecisionType_DECISION_TYPE_UNSPECIFIED {
			t.Fatalf("no decision: %v %v", dec, err)
		}
	})
}
