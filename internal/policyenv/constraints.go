package policyenv

import (
	"strconv"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/troupe-run/troupe/proto/capv1"
)

// Env entries through which constraints reach workers: the names CAP
// workers and their SDKs already read.
const (
	EnvPolicyConstraints = "CORDUM_POLICY_CONSTRAINTS"  // the PolicyConstraints as protojson
	EnvRedactionLevel    = "CORDUM_REDACTION_LEVEL"     // constraints.redaction_level
	EnvMaxArtifactBytes  = "CORDUM_MAX_ARTIFACT_BYTES"  // budgets.max_artifact_bytes
	EnvMaxConcurrentJobs = "CORDUM_MAX_CONCURRENT_JOBS" // budgets.max_concurrent_jobs
	EnvMaxRetries        = "CORDUM_MAX_RETRIES"         // budgets.max_retries
)

// ApplyConstraints writes an ALLOW_WITH_CONSTRAINTS decision's constraints
// into the request the worker receives: the env entries above, and
// budget.deadline_ms lowered to max_runtime_ms (set to it when the job had
// no deadline). Zero limits are not written: zero means "no limit" in CAP.
// It changes req; nil constraints leave it as it is.
func ApplyConstraints(req *capv1.JobRequest, c *capv1.PolicyConstraints) {
	if req == nil || c == nil {
		return
	}
	if req.Env == nil {
		req.Env = map[string]string{}
	}
	if b, err := protojson.Marshal(c); err == nil {
		req.Env[EnvPolicyConstraints] = string(b)
	}
	if lvl := c.GetRedactionLevel(); lvl != "" {
		req.Env[EnvRedactionLevel] = lvl
	}
	b := c.GetBudgets()
	if b == nil {
		return
	}
	if rt := b.GetMaxRuntimeMs(); rt > 0 {
		if req.Budget == nil {
			req.Budget = &capv1.Budget{}
		}
		if req.Budget.DeadlineMs == 0 || req.Budget.DeadlineMs > rt {
			req.Budget.DeadlineMs = rt
		}
	}
	if n := b.GetMaxArtifactBytes(); n > 0 {
		req.Env[EnvMaxArtifactBytes] = strconv.FormatInt(n, 10)
	}
	if n := b.GetMaxConcurrentJobs(); n > 0 {
		req.Env[EnvMaxConcurrentJobs] = strconv.Itoa(int(n))
	}
	if n := b.GetMaxRetries(); n > 0 {
		req.Env[EnvMaxRetries] = strconv.Itoa(int(n))
	}
}

// DecisionFields is a decision as field/value pairs for the job record:
// decision, reason, rule id, policy version, and (when present)
// constraints and remediations as protojson.
func DecisionFields(resp *capv1.PolicyCheckResponse) []string {
	f := []string{"policy_decision", DecisionLabel(resp.GetDecision()), "policy_reason", resp.GetReason(),
		"rule_id", resp.GetRuleId(), "policy_snapshot", resp.GetPolicySnapshot()}
	if c := resp.GetConstraints(); c != nil {
		if b, err := protojson.Marshal(c); err == nil {
			f = append(f, "policy_constraints", string(b))
		}
	}
	if rs := resp.GetRemediations(); len(rs) > 0 {
		list := &capv1.PolicyCheckResponse{Remediations: rs}
		if b, err := protojson.Marshal(list); err == nil {
			f = append(f, "policy_remediations", string(b))
		}
	}
	return f
}
