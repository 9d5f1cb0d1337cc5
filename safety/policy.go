// Package safety decides whether a job may run (input policy) and whether its
// result may be released (output policy).
//
// Input: the job actor calls an InputPolicy. Engine is the built-in policy
// engine over CAP's safety policy YAML (engine.go, policyfile.go, match.go,
// reloaded by engine_watch.go); KernelServer serves it as the SafetyKernel
// gRPC service; KernelClient asks a remote kernel, behind a circuit breaker
// whose state replicas share in Redis (kernel_client.go, breaker.go), and
// never turns an outage into a denial.
//
// Output: OutputChecker decides in two phases, metadata then content.
// OutputPolicy is the built-in checker (output.go, output_scan.go);
// RemoteOutputChecker and OutputServer are the gRPC pair
// (output_remote.go); OutputGate runs the phases for the job actor
// (output_flow.go).
//
// This file holds the interfaces and the request builder CAP kernels expect.
package safety

import (
	"context"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// InputPolicy checks a job before dispatch. The SafetyKernel gRPC client and
// the built-in engine both implement it.
type InputPolicy interface {
	Check(ctx context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error)
}

// Inline is implemented by policies that decide from memory in
// microseconds, without I/O. The job actor calls them inside its mailbox;
// any other policy is asked from a goroutine so the actor never waits on the
// network.
type Inline interface{ Inline() bool }

// IsInline reports whether p may be called inside an actor's mailbox.
func IsInline(p InputPolicy) bool {
	i, ok := p.(Inline)
	return ok && i.Inline()
}

// The implementations the node plugs in.
var (
	_ InputPolicy   = AllowAll{}
	_ InputPolicy   = TopicRules{}
	_ InputPolicy   = (*Engine)(nil)
	_ OutputChecker = (*OutputPolicy)(nil)
)

// AllowAll is the input policy of `troupe dev` and of nodes started with no
// policy: every job is allowed. It never fails.
type AllowAll struct{}

// allowAllRuleID is the rule id AllowAll reports.
const allowAllRuleID = "troupe:allow-all"

// Inline: AllowAll decides from memory.
func (AllowAll) Inline() bool { return true }

// Check allows req.
func (AllowAll) Check(_ context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW,
		Reason: "allow-all policy", RuleId: allowAllRuleID, PolicySnapshot: "allow-all"}, nil
}

// TenantOf returns the tenant a request is accounted to: tenant_id, then
// env["tenant_id"], then "default" (CAP's rule).
func TenantOf(req *capv1.JobRequest) string { return jobstate.TenantOf(req) }

// CheckRequest builds the PolicyCheckRequest CAP kernels expect for req.
func CheckRequest(req *capv1.JobRequest) *capv1.PolicyCheckRequest {
	pr := &capv1.PolicyCheckRequest{
		JobId: req.JobId, Topic: req.Topic, Tenant: TenantOf(req), Priority: req.Priority,
		Budget: req.Budget, PrincipalId: req.PrincipalId, Labels: req.Labels, MemoryId: req.MemoryId,
		Meta: req.Meta,
	}
	if cfg := req.Env["CORDUM_EFFECTIVE_CONFIG"]; cfg != "" {
		pr.EffectiveConfig = []byte(cfg)
	}
	return pr
}
