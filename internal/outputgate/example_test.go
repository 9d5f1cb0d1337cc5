package outputgate_test

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/outputgate"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// The output policy from the result path: phase 1 before SUCCEEDED,
// phase 2 after it.
func ExampleGate() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	metrics, _ := outputgate.NewMetrics(prometheus.NewRegistry())
	gate := &outputgate.Gate{Checker: safety.DefaultOutputPolicy(),
		Results: &safety.RedisResultStore{Client: rdb}, Metrics: metrics}

	job := &capv1.JobRequest{JobId: "j1", Topic: "job.echo"}
	res := &capv1.JobResult{JobId: "j1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: "redis://res:j1"}
	req := outputgate.Request(job, res)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	o := gate.Phase1(ctx, req)
	if o.Quarantine {
		// OUTPUT_QUARANTINED + DLQ + audit; record o.Fields();
		// metrics.Quarantined(outputgate.PhaseMeta).
		return
	}
	res.ResultPtr = o.ResultPtr // swapped when a redacted copy was made
	// ... SUCCEEDED is recorded with o.Fields() ...
	if !o.ContentChecked {
		o2 := gate.Phase2(context.Background(), req) // its own 30 s budget
		if o2.Quarantine {
			// Downgrade SUCCEEDED → OUTPUT_QUARANTINED only if the job is
			// still SUCCEEDED and ours; then metrics.Quarantined(outputgate.PhaseContent).
		}
	}
}
