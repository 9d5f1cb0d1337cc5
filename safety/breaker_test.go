package safety_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/troupe-run/troupe/internal/policyx"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// hangTimeout is the client timeout in breaker tests: a hanging kernel
// costs this much per call.
const hangTimeout = 150 * time.Millisecond

type breakerBundle struct {
	kernel *fakeKernel
	addr   string
	clock  *clock
	env    *testenv.Env
}

func setupBreaker(t *testing.T) *breakerBundle {
	t.Helper()
	b := &breakerBundle{kernel: newFakeKernel(), clock: newClock(), env: testenv.New(t)}
	b.addr = serve(t, nil, func(s *grpc.Server) { capv1.RegisterSafetyKernelServer(s, b.kernel) })
	return b
}

func (b *breakerBundle) client(t *testing.T, rdb redis.UniversalClient, mode policyx.FailMode, reg prometheus.Registerer) *policyx.KernelClient {
	t.Helper()
	return b.clientTimeout(t, rdb, mode, reg, hangTimeout)
}

// clientTimeout is client with its own call timeout: a test whose kernel
// never hangs gives a loaded machine room (150 ms ran out for a kernel
// that answers at load ~35).
func (b *breakerBundle) clientTimeout(t *testing.T, rdb redis.UniversalClient, mode policyx.FailMode, reg prometheus.Registerer,
	timeout time.Duration) *policyx.KernelClient {
	t.Helper()
	c, err := policyx.NewKernelClient(policyx.KernelClientConfig{Addr: b.addr, Timeout: timeout, Redis: rdb,
		KeyPrefix: b.env.KeyPrefix(), FailMode: mode, Clock: b.clock.Now, Log: quietLog, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// expectUnavailable: the check had no decision, and says whether the
// kernel was called at all.
func expectUnavailable(t *testing.T, c *policyx.KernelClient, breakerOpen bool) {
	t.Helper()
	resp, err := c.Check(context.Background(), req("job.x", "acme"))
	if resp != nil {
		t.Fatalf("a decision without a kernel: %v", resp)
	}
	var ue *policyx.UnavailableError
	if !errors.Is(err, safety.ErrUnavailable) || !errors.As(err, &ue) {
		t.Fatalf("err %v, want ErrUnavailable", err)
	}
	if ue.BreakerOpen != breakerOpen {
		t.Fatalf("breaker open %v, want %v (%v)", ue.BreakerOpen, breakerOpen, err)
	}
}

func expectAllowed(t *testing.T, c *policyx.KernelClient) {
	t.Helper()
	resp, err := c.Check(context.Background(), req("job.x", "acme"))
	if err != nil || resp.Decision != allow || resp.RuleId != "fake" {
		t.Fatalf("check: %v %v", resp, err)
	}
}

func (b *breakerBundle) calls(t *testing.T, want int64) {
	t.Helper()
	if got := b.kernel.calls.Load(); got != want {
		t.Fatalf("kernel called %d times, want %d", got, want)
	}
}

// The breaker's life against a kernel that fails, then hangs, then
// recovers, with its state shared in Redis and (second run) counted in
// process when Redis is unreachable.
func TestBreakerFailsHangsRecovers(t *testing.T) {
	t.Parallel()
	deadRedis := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond,
		DialerRetries: 1})
	t.Cleanup(func() { deadRedis.Close() })
	for name, shared := range map[string]bool{"redis": true, "redis unreachable": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupBreaker(t)
			var rdb redis.UniversalClient = deadRedis
			if shared {
				rdb = b.env.Redis
			}
			c := b.client(t, rdb, policyx.FailClosed, nil)
			ctx := context.Background()

			expectAllowed(t, c)
			b.calls(t, 1)

			// Fails: three consecutive failures open the circuit.
			b.kernel.mode.Store(kernelFail)
			for i := 0; i < policyx.BreakerFailuresDefault; i++ {
				expectUnavailable(t, c, false)
			}
			b.calls(t, 4)
			if s := c.BreakerState(ctx); s != policyx.BreakerOpen {
				t.Fatalf("state %v after 3 failures", s)
			}
			// Open: the kernel is not called.
			expectUnavailable(t, c, true)
			b.clock.Advance(policyx.BreakerOpenDefault - time.Millisecond)
			expectUnavailable(t, c, true)
			b.calls(t, 4)

			// Hangs: the half-open probe times out and the circuit opens
			// again for a full period.
			b.clock.Advance(time.Millisecond)
			b.kernel.mode.Store(kernelHang)
			start := time.Now()
			expectUnavailable(t, c, false)
			if d := time.Since(start); d < hangTimeout || d > 20*hangTimeout {
				t.Fatalf("a hanging kernel took %v, want about %v", d, hangTimeout)
			}
			b.calls(t, 5)
			expectUnavailable(t, c, true)
			b.calls(t, 5)

			// Recovers: after the open period, two successful probes close
			// the circuit; one is not enough.
			b.clock.Advance(policyx.BreakerOpenDefault)
			b.kernel.mode.Store(kernelOK)
			expectAllowed(t, c)
			if s := c.BreakerState(ctx); s != policyx.BreakerHalfOpen {
				t.Fatalf("state %v after one probe", s)
			}
			expectAllowed(t, c)
			if s := c.BreakerState(ctx); s != policyx.BreakerClosed {
				t.Fatalf("state %v after two probes", s)
			}
			expectAllowed(t, c)
			b.calls(t, 8)

			// Closed again: a success resets the count, so two failures,
			// a success and two failures do not open it.
			b.kernel.mode.Store(kernelFail)
			expectUnavailable(t, c, false)
			expectUnavailable(t, c, false)
			b.kernel.mode.Store(kernelOK)
			expectAllowed(t, c)
			b.kernel.mode.Store(kernelFail)
			expectUnavailable(t, c, false)
			expectUnavailable(t, c, false)
			if s := c.BreakerState(ctx); s != policyx.BreakerClosed {
				t.Fatalf("state %v: failures were not consecutive", s)
			}
		})
	}
}

// Half-open lets exactly three probes through at once.
func TestBreakerHalfOpenProbeLimit(t *testing.T) {
	t.Parallel()
	b := setupBreaker(t)
	c := b.client(t, b.env.Redis, policyx.FailClosed, nil)
	b.kernel.mode.Store(kernelFail)
	for i := 0; i < 3; i++ {
		expectUnavailable(t, c, false)
	}
	b.clock.Advance(policyx.BreakerOpenDefault)
	b.kernel.mode.Store(kernelHang)
	b.kernel.entered = make(chan struct{}, 8)
	before := b.kernel.calls.Load()

	// Three probes hang in the kernel; only then do two more callers try.
	var wg sync.WaitGroup
	probeErrs := make(chan error, 3)
	for i := 0; i < policyx.BreakerProbesDefault; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.Check(context.Background(), req("job.x", "acme"))
			probeErrs <- err
		}()
	}
	for i := 0; i < policyx.BreakerProbesDefault; i++ {
		select {
		case <-b.kernel.entered:
		case <-time.After(5 * time.Second):
			t.Fatal("probe did not reach the kernel")
		}
	}
	expectUnavailable(t, c, true)
	expectUnavailable(t, c, true)
	wg.Wait()
	close(probeErrs)
	for err := range probeErrs {
		var ue *policyx.UnavailableError
		if !errors.As(err, &ue) || ue.BreakerOpen {
			t.Fatalf("probe: %v", err)
		}
	}
	if got := b.kernel.calls.Load() - before; got != policyx.BreakerProbesDefault {
		t.Fatalf("%d calls through a half-open circuit, want %d", got, policyx.BreakerProbesDefault)
	}
	if s := c.BreakerState(context.Background()); s != policyx.BreakerOpen {
		t.Fatalf("state %v after failed probes", s)
	}
}

// Two replicas share one breaker: failures counted on either add up, and a
// circuit one opens is open for the other at its very next check.
func TestBreakerSharedAcrossReplicas(t *testing.T) {
	t.Parallel()
	b := setupBreaker(t)
	// Two clients with their own Redis connections, as two nodes have.
	other := redis.NewClient(&redis.Options{Addr: b.env.Redis.Options().Addr})
	t.Cleanup(func() { other.Close() })
	one := b.client(t, b.env.Redis, policyx.FailClosed, nil)
	two := b.client(t, other, policyx.FailClosed, nil)

	b.kernel.mode.Store(kernelFail)
	expectUnavailable(t, one, false)
	expectUnavailable(t, two, false)
	expectUnavailable(t, one, false) // third consecutive failure, across replicas
	b.calls(t, 3)
	expectUnavailable(t, two, true) // open for the replica that did not open it
	b.calls(t, 3)

	// Recovery is shared too: probes from both close it.
	b.clock.Advance(policyx.BreakerOpenDefault)
	b.kernel.mode.Store(kernelOK)
	expectAllowed(t, two)
	expectAllowed(t, one)
	if s := one.BreakerState(context.Background()); s != policyx.BreakerClosed {
		t.Fatalf("state %v", s)
	}
	b.calls(t, 5)
}

// Fail closed returns ErrUnavailable; fail open allows with a warning and
// counts troupe_input_fail_open_total{topic}. Neither ever denies.
func TestFailOpenVersusFailClosed(t *testing.T) {
	t.Parallel()
	b := setupBreaker(t)
	b.kernel.mode.Store(kernelFail)
	// The kernel fails at once or answers: no call waits out a timeout.
	closed := b.clientTimeout(t, nil, policyx.FailClosed, nil, 10*time.Second)
	reg := prometheus.NewRegistry()
	open := b.clientTimeout(t, nil, policyx.FailOpen, reg, 10*time.Second)

	expectUnavailable(t, closed, false)
	for i := 0; i < 5; i++ { // past the breaker opening: still allowed
		resp, err := open.Check(context.Background(), req("job.x", "acme"))
		if err != nil || resp.Decision != allow || resp.RuleId != policyx.RuleFailOpen ||
			resp.PolicySnapshot != policyx.SnapshotFailOpen || resp.Reason == "" {
			t.Fatalf("fail open: %v %v", resp, err)
		}
	}
	if n := counterValue(t, reg, "troupe_input_fail_open_total", "topic", "job.x"); n != 5 {
		t.Fatalf("troupe_input_fail_open_total{topic=job.x} = %v, want 5", n)
	}

	// A kernel that answers is passed through in both modes, THROTTLE
	// included.
	b.clock.Advance(policyx.BreakerOpenDefault)
	b.kernel.mode.Store(kernelOK)
	b.kernel.decision.Store(int32(throttle))
	for _, c := range []*policyx.KernelClient{closed, open} {
		resp, err := c.Check(context.Background(), req("job.x", "acme"))
		if err != nil || resp.Decision != throttle {
			t.Fatalf("throttle: %v %v", resp, err)
		}
	}
}

// A caller that gives up is not the kernel's failure.
func TestCallerCancelIsNotAKernelFailure(t *testing.T) {
	t.Parallel()
	b := setupBreaker(t)
	c := b.client(t, b.env.Redis, policyx.FailOpen, nil)
	b.kernel.mode.Store(kernelHang)
	b.kernel.entered = make(chan struct{}, 8)
	for i := 0; i < 4; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-b.kernel.entered; cancel() }()
		resp, err := c.Check(ctx, req("job.x", "acme"))
		if resp != nil || !errors.Is(err, context.Canceled) || !errors.Is(err, safety.ErrUnavailable) {
			t.Fatalf("cancelled check: %v %v", resp, err)
		}
	}
	if s := c.BreakerState(context.Background()); s != policyx.BreakerClosed {
		t.Fatalf("state %v after caller cancels", s)
	}
}

func TestDecisionCache(t *testing.T) {
	t.Parallel()
	b := setupBreaker(t)
	c, err := policyx.NewKernelClient(policyx.KernelClientConfig{Addr: b.addr, CacheTTL: time.Minute, Clock: b.clock.Now,
		Log: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b.kernel.decision.Store(int32(human))
	r1 := req("job.x", "acme")
	r2 := req("job.x", "acme")
	r2.JobId = "job-2"
	r2.Labels["cordum.bus_msg_id"] = "m-2"
	a, _ := c.Check(ctx, r1)
	bb, _ := c.Check(ctx, r2)
	b.calls(t, 1)
	if a.ApprovalRef != "job-1" || bb.ApprovalRef != "job-2" || bb.Decision != human {
		t.Fatalf("cached decision not rebound to the job: %v / %v", a, bb)
	}
	r3 := req("job.x", "acme", labels("approval_granted", "true"))
	_, _ = c.Check(ctx, r3)
	b.calls(t, 2) // a label a rule could match on is part of the key
	b.clock.Advance(time.Minute)
	_, _ = c.Check(ctx, r1)
	b.calls(t, 3) // expired

	b.kernel.decision.Store(int32(throttle))
	r4 := req("job.y", "acme")
	_, _ = c.Check(ctx, r4)
	_, _ = c.Check(ctx, r4)
	b.calls(t, 5) // THROTTLE is never cached
}

// Any error from the kernel is "no decision", not a denial.
func TestKernelErrorsAreNeverDenials(t *testing.T) {
	t.Parallel()
	k := &erroringKernel{}
	addr := serve(t, nil, func(s *grpc.Server) { capv1.RegisterSafetyKernelServer(s, k) })
	c, err := policyx.NewKernelClient(policyx.KernelClientConfig{Addr: addr, Log: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, code := range []codes.Code{codes.PermissionDenied, codes.InvalidArgument, codes.Internal} {
		k.code = code
		resp, err := c.Check(context.Background(), req("job.x", "acme"))
		if resp != nil || !errors.Is(err, safety.ErrUnavailable) || status.Code(errors.Unwrap(err)) != code {
			t.Fatalf("%v: %v %v", code, resp, err)
		}
	}
}

type erroringKernel struct {
	capv1.UnimplementedSafetyKernelServer
	code codes.Code
}

func (k *erroringKernel) Check(context.Context, *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	return nil, status.Error(k.code, "no")
}

// The outage, at the client: the kernel is down while 4,000 jobs
// are checked from two replicas. No check is a denial, the open circuit
// spares the dead kernel nearly every call, and once the kernel is back
// every job gets its decision within a few retries.
func TestKernelOutageNeverDenies(t *testing.T) {
	t.Parallel()
	b := setupBreaker(t)
	other := redis.NewClient(&redis.Options{Addr: b.env.Redis.Options().Addr})
	t.Cleanup(func() { other.Close() })
	replicas := []*policyx.KernelClient{b.client(t, b.env.Redis, policyx.FailClosed, nil), b.client(t, other, policyx.FailClosed, nil)}
	const jobs, workers = 4000, 8
	b.kernel.mode.Store(kernelFail)

	type result struct {
		denied, unavailable, decided int
	}
	check := func(job int) (capv1.DecisionType, error) {
		r := req("job.x", "acme")
		r.JobId = "job-" + strconv.Itoa(job)
		resp, err := replicas[job%2].Check(context.Background(), r)
		if err != nil {
			return 0, err
		}
		return resp.Decision, nil
	}
	run := func(pending []int) (result, []int) {
		var mu sync.Mutex
		var res result
		var retry []int
		var wg sync.WaitGroup
		next := make(chan int)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for job := range next {
					d, err := check(job)
					mu.Lock()
					switch {
					case errors.Is(err, safety.ErrUnavailable):
						res.unavailable++
						retry = append(retry, job)
					case err != nil:
						t.Errorf("job %d: %v", job, err)
					case d == deny:
						res.denied++
					default:
						res.decided++
					}
					mu.Unlock()
				}
			}()
		}
		for _, j := range pending {
			next <- j
		}
		close(next)
		wg.Wait()
		return res, retry
	}
	all := make([]int, jobs)
	for i := range all {
		all[i] = i
	}
	res, pending := run(all)
	if res.denied != 0 || res.decided != 0 || res.unavailable != jobs {
		t.Fatalf("during the outage: %+v", res)
	}
	// Before the circuit opened, at most every worker had a call in flight.
	if calls := b.kernel.calls.Load(); calls > policyx.BreakerFailuresDefault+workers {
		t.Fatalf("the dead kernel was called %d times", calls)
	}

	b.kernel.mode.Store(kernelOK)
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == 10 {
			t.Fatalf("%d jobs still without a decision", len(pending))
		}
		b.clock.Advance(policyx.BreakerOpenDefault) // the job actor's retry backoff
		res, pending = run(pending)
		if res.denied != 0 {
			t.Fatalf("after the outage: %+v", res)
		}
	}
}
