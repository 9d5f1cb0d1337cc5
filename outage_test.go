package troupe_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/policyx"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/worker"
)

// switchableKernel is a real SafetyKernel gRPC server that can be taken down.
type switchableKernel struct {
	*policyx.KernelServer
	down atomic.Bool
}

func (k *switchableKernel) Check(ctx context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	if k.down.Load() {
		return nil, status.Error(codes.Unavailable, "kernel down")
	}
	return k.KernelServer.Check(ctx, req)
}

// An outage of the safety kernel never turns into a denial: jobs submitted
// while it is down wait (fail closed, circuit open), and every one of them
// succeeds once it is back. The full scenario is 20 s and 4,000
// jobs (TROUPE_OUTAGE_FULL=1); by default it is scaled down to stay a unit
// test (3 s, 400 jobs).
func TestKernelOutageDeniesNothing(t *testing.T) {
	t.Parallel()
	engine, err := safety.NewEngine([]byte("rules:\n  - id: all\n    match: {topics: [\"job.*\"]}\n    decision: allow\n"))
	if err != nil {
		t.Fatal(err)
	}
	k := &switchableKernel{KernelServer: policyx.NewKernelServer(engine)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	capv1.RegisterSafetyKernelServer(srv, k)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	full := os.Getenv("TROUPE_OUTAGE_FULL") == "1"
	var client *policyx.KernelClient
	f := newFixture(t, func(c *troupe.Config) {
		cfg := policyx.KernelClientConfig{Addr: lis.Addr().String(), Timeout: time.Second}
		if !full {
			// The breaker opens for 1 s instead of 30 s, and a job retries
			// every 200 ms instead of backing off to 30 s: the same path, in
			// seconds. The full scenario runs with the real defaults.
			cfg.Breaker = policyx.BreakerConfig{OpenFor: time.Second}
			troupe.SetBackoff(c, func(int) time.Duration { return 200 * time.Millisecond })
			c.Tuning.MaxSchedulingAttempts = 1000
		} else {
			troupe.SetBackoff(c, nil)
		}
		client, err = policyx.NewKernelClient(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c.Policy = client
	})
	defer client.Close()
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "wk", Pool: "echo", Topics: []string{"job.echo"}, Direct: true,
		SubjectPrefix: f.subj.Prefix(), Heartbeat: time.Second, MaxParallel: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	f.waitWorkers(1)

	jobs, outage, within := 400, 3*time.Second, 60*time.Second
	if full {
		jobs, outage, within = 4000, 20*time.Second, 3*time.Minute
	}
	k.down.Store(true)
	start := time.Now()
	for i := 0; i < jobs; i++ {
		f.submit(echoReq(fmt.Sprintf("out-%d", i)))
	}
	time.Sleep(outage - time.Since(start)) // the rest of the outage
	k.down.Store(false)
	back := time.Now()
	denied := 0
	for i := 0; i < jobs; i++ {
		r := f.waitStateWithin(fmt.Sprintf("out-%d", i), jobstate.StateSucceeded, within)
		if r.State == jobstate.StateDenied {
			denied++
		}
	}
	if denied != 0 {
		t.Fatalf("%d jobs denied by an outage", denied)
	}
	t.Logf("%d jobs submitted during a %v outage: all SUCCEEDED %v after the kernel returned, 0 DENIED",
		jobs, outage, time.Since(back).Round(time.Millisecond))
	if got := counter(t, f.node, "troupe_scheduling_retries_total", string(jobstate.ReasonSafetyUnavailable)); got == 0 {
		t.Fatal("no job ever waited for the kernel")
	}
}
