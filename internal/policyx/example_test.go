package policyx_test

import (
	"context"
	"errors"
	"log"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/policyx"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// A node pointed at an external kernel: configuration from the
// environment (SAFETY_KERNEL_ADDR, ...), the breaker shared through the
// node's Redis, and what the job actor does with each outcome.
func ExampleNewKernelClient() {
	cfg, err := policyx.KernelClientConfigFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:50051"
	}
	cfg.Redis = redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	cfg.KeyPrefix = "troupe:"
	cfg.Metrics = prometheus.NewRegistry()
	client, err := policyx.NewKernelClient(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	var policy safety.InputPolicy = client
	job := &capv1.JobRequest{JobId: "j1", Topic: "job.echo", TenantId: "acme"}
	resp, err := policy.Check(context.Background(), safety.CheckRequest(job))
	switch {
	case errors.Is(err, safety.ErrUnavailable):
		// Fail closed: no decision. Retry the job later with backoff;
		// never DENY.
	case err != nil:
		// Not returned by KernelClient; treat like ErrUnavailable.
	case resp.Decision == capv1.DecisionType_DECISION_TYPE_THROTTLE:
		// Retry after 5 s.
	default:
		// ALLOW / ALLOW_WITH_CONSTRAINTS / REQUIRE_HUMAN / DENY as the
		// kernel decided.
	}
}
