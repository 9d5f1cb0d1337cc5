package safety_test

import (
	"context"
	"fmt"
	"log"

	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// The built-in engine is an InputPolicy: `troupe dev` and `troupe node
// --policy FILE` use it in process.
func ExampleNewEngine() {
	e, err := safety.NewEngine([]byte(`
version: v1
rules:
  - id: no-admin
    match: {topics: ["job.admin.*"]}
    decision: deny
    reason: admin jobs go through the console
  - id: sandbox
    match: {capabilities: [code.exec]}
    decision: allow
    constraints: {budgets: {max_runtime_ms: 60000}}
`))
	if err != nil {
		log.Fatal(err)
	}
	var policy safety.InputPolicy = e
	for _, topic := range []string{"job.admin.reset", "job.echo", "sys.x"} {
		resp, _ := policy.Check(context.Background(), &capv1.PolicyCheckRequest{JobId: "j1", Topic: topic})
		fmt.Println(topic, resp.Decision, resp.RuleId)
	}
	resp, _ := e.Explain(context.Background(), &capv1.PolicyCheckRequest{JobId: "j1", Topic: "job.admin.reset"})
	fmt.Println(resp.Reason)
	// Output:
	// job.admin.reset DECISION_TYPE_DENY no-admin
	// job.echo DECISION_TYPE_ALLOW default:allow
	// sys.x DECISION_TYPE_DENY builtin:non-job-topic
	// rule no-admin matched: topic job.admin.reset ~ job.admin.* (admin jobs go through the console)
}
