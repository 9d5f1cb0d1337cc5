package safety_test

import (
	"context"
	"testing"

	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

func TestHashJobRequestIgnoresOnlyApprovalBookkeeping(t *testing.T) {
	t.Parallel()
	base := func() *capv1.JobRequest {
		return &capv1.JobRequest{JobId: "j", Topic: "job.x", Labels: map[string]string{"a": "1", "b": "2"},
			Env: map[string]string{"K": "V"}}
	}
	h := safety.HashJobRequest(base())
	if len(h) != 64 || h != safety.HashJobRequest(base()) {
		t.Fatalf("hash %q not stable", h)
	}
	r := base()
	r.Labels["approval_granted"] = "true"
	r.Labels["approval_by"] = "x"
	r.Labels["cordum.bus_msg_id"] = "m1"
	r.Env["CORDUM_EFFECTIVE_CONFIG"] = "{}"
	if safety.HashJobRequest(r) != h {
		t.Fatal("approval bookkeeping changed the hash")
	}
	if r.Labels["approval_granted"] != "true" {
		t.Fatal("hashing mutated the request")
	}
	r = base()
	r.Labels["a"] = "changed"
	if safety.HashJobRequest(r) == h {
		t.Fatal("a changed label kept the hash")
	}
	r = base()
	r.Topic = "job.y"
	if safety.HashJobRequest(r) == h {
		t.Fatal("a changed topic kept the hash")
	}
}

func TestTopicRules(t *testing.T) {
	t.Parallel()
	p := safety.TopicRules{Deny: []string{"job.bad"}, Approve: []string{"job.risky.*"}}
	for topic, want := range map[string]capv1.DecisionType{
		"job.bad":      capv1.DecisionType_DECISION_TYPE_DENY,
		"job.risky.rm": capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN,
		"job.echo":     capv1.DecisionType_DECISION_TYPE_ALLOW,
	} {
		got, _ := p.Check(context.Background(), &capv1.PolicyCheckRequest{Topic: topic})
		if got.Decision != want {
			t.Errorf("%s: %v, want %v", topic, got.Decision, want)
		}
	}
}
