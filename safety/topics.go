package safety

import (
	"context"
	"path"

	"github.com/troupe-run/troupe/proto/capv1"
)

// TopicRules is a small input policy for development and simple setups:
// topics matching a Deny pattern are denied, those matching an Approve
// pattern need a human, everything else is allowed. Patterns use path.Match,
// as CAP policies do: "job.*" matches job.x and also job.x.y (path.Match's
// star stops only at '/').
type TopicRules struct {
	Deny    []string
	Approve []string
}

// Inline: TopicRules decides from memory.
func (TopicRules) Inline() bool { return true }

// Check applies the rules to req.
func (p TopicRules) Check(_ context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	for _, pat := range p.Deny {
		if ok, _ := path.Match(pat, req.Topic); ok {
			return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_DENY,
				Reason: "topic " + req.Topic + " is denied", RuleId: "topic-deny:" + pat, PolicySnapshot: "topic-rules"}, nil
		}
	}
	for _, pat := range p.Approve {
		if ok, _ := path.Match(pat, req.Topic); ok {
			return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN,
				Reason: "topic " + req.Topic + " needs approval", RuleId: "topic-approve:" + pat,
				ApprovalRequired: true, ApprovalRef: req.JobId, PolicySnapshot: "topic-rules"}, nil
		}
	}
	return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW, Reason: "no rule matched",
		RuleId: "topic-default:allow", PolicySnapshot: "topic-rules"}, nil
}
