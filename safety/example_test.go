package safety_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

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

// The output policy from the result path: phase 1 before SUCCEEDED,
// phase 2 after it.
func ExampleOutputGate() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	metrics, _ := safety.NewOutputMetrics(prometheus.NewRegistry())
	gate := &safety.OutputGate{Checker: safety.DefaultOutputPolicy(),
		Results: &safety.RedisResultStore{Client: rdb}, Metrics: metrics}

	job := &capv1.JobRequest{JobId: "j1", Topic: "job.echo"}
	res := &capv1.JobResult{JobId: "j1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: "redis://res:j1"}
	req := safety.OutputRequest(job, res)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	o := gate.Phase1(ctx, req)
	if o.Quarantine {
		// OUTPUT_QUARANTINED + DLQ + audit; record o.Fields();
		// metrics.Quarantined(safety.PhaseMeta).
		return
	}
	res.ResultPtr = o.ResultPtr // swapped when a redacted copy was made
	// ... SUCCEEDED is recorded with o.Fields() ...
	if !o.ContentChecked {
		o2 := gate.Phase2(context.Background(), req) // its own 30 s budget
		if o2.Quarantine {
			// Downgrade SUCCEEDED → OUTPUT_QUARANTINED only if the job is
			// still SUCCEEDED and ours; then metrics.Quarantined(PhaseContent).
		}
	}
}
