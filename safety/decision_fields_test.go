package safety_test

import (
	"strings"
	"testing"

	"github.com/troupe-run/troupe/internal/policyenv"
)

// The job record's policy fields (written by the job actor with
// policyenv.DecisionFields) from a decision of the engine.
func TestDecisionFields(t *testing.T) {
	t.Parallel()
	e, _ := loadTestPolicy(t)
	resp, _ := e.Check(t.Context(), req("job.db.drop", "acme"))
	f := strings.Join(policyenv.DecisionFields(resp), "|")
	for _, w := range []string{"policy_decision|deny", "rule_id|block-prod-delete", "policy_snapshot|v7:", "policy_remediations|{",
		"use-archive"} {
		if !strings.Contains(f, w) {
			t.Errorf("fields %q lack %q", f, w)
		}
	}
}
