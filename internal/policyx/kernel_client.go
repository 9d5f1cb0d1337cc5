package policyx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	"github.com/troupe-run/troupe/internal/policyenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// KernelTimeoutDefault bounds one check: CAP's reference client value, and
// well under the job actor's own deadline.
const KernelTimeoutDefault = 2 * time.Second

// FailMode says what a check does when the kernel is unavailable.
type FailMode string

const (
	// FailClosed (the default): the check returns ErrUnavailable and the
	// job waits and retries. No job runs without a decision.
	FailClosed FailMode = "closed"
	// FailOpen: the check allows, with a warning reason and
	// troupe_input_fail_open_total{topic}.
	FailOpen FailMode = "open"
)

// parseFailMode reads "closed" or "open" (any case; "" is closed).
func parseFailMode(s string) (FailMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "closed":
		return FailClosed, nil
	case "open":
		return FailOpen, nil
	}
	return "", fmt.Errorf("safety: fail mode %q: want closed or open", s)
}

// Rule id and snapshot of a fail-open allow.
const (
	RuleFailOpen     = "troupe:fail-open"
	SnapshotFailOpen = "fail-open"
)

// KernelClientConfig configures a KernelClient.
type KernelClientConfig struct {
	// Addr is the kernel's gRPC address, host:port (required).
	Addr string
	// TLS: how to reach it. Loopback addresses may go plaintext without
	// saying so; anything else needs TLS settings or TLS.Insecure.
	TLS ClientTLS
	// Timeout bounds one check (default KernelTimeoutDefault).
	Timeout time.Duration
	// Redis, when set, holds the circuit breaker's state so that every
	// replica sees an open circuit at once. Without it, or while it is
	// unreachable, each process counts on its own.
	Redis redis.UniversalClient
	// KeyPrefix goes before the breaker's Redis key (the node's prefix).
	KeyPrefix string
	// FailMode applies when the kernel is unavailable (default
	// FailClosed). TROUPE_POLICY_CHECK_FAIL_MODE, when set, overrides it.
	FailMode FailMode
	// Breaker tunes the circuit breaker (zero fields: CAP's values).
	Breaker BreakerConfig
	// CacheTTL > 0 caches decisions (except THROTTLE) for that long,
	// keyed by hashCheckRequest. Off by default: a cached decision
	// outlives a policy change by up to the TTL.
	CacheTTL time.Duration
	// CacheSize bounds the cache (default decisionCacheSizeDefault).
	CacheSize int
	// Metrics, when set, receives the client's series.
	Metrics prometheus.Registerer
	// Log receives warnings (default slog.Default()).
	Log *slog.Logger
	// Clock is the breaker's and cache's time source (default time.Now);
	// tests move it by hand.
	Clock func() time.Time
	// DialOptions are appended to the client's own (tests, interceptors).
	DialOptions []grpc.DialOption
}

// KernelClientConfigFromEnv reads the SAFETY_KERNEL_* variables, the fail
// mode and the cache TTL. Addr is "" when no kernel is configured (the
// caller then uses the built-in engine or AllowAll).
func KernelClientConfigFromEnv() (KernelClientConfig, error) {
	cfg := KernelClientConfig{Addr: strings.TrimSpace(os.Getenv(EnvKernelAddr)),
		TLS: ClientTLS{CAFile: strings.TrimSpace(os.Getenv(EnvKernelTLSCA))}}
	var err error
	if cfg.TLS.Required, err = policyenv.EnvBool(EnvKernelTLSReq); err != nil {
		return cfg, err
	}
	if cfg.TLS.Insecure, err = policyenv.EnvBool(EnvKernelInsecure); err != nil {
		return cfg, err
	}
	if cfg.FailMode, err = parseFailMode(os.Getenv(EnvFailMode)); err != nil {
		return cfg, err
	}
	if v := strings.TrimSpace(os.Getenv(EnvDecisionTTL)); v != "" {
		if cfg.CacheTTL, err = parseTTL(v); err != nil {
			return cfg, fmt.Errorf("safety: %s: %w", EnvDecisionTTL, err)
		}
	}
	return cfg, nil
}

// parseTTL reads a Go duration ("30s") or a number of seconds ("30").
func parseTTL(v string) (time.Duration, error) {
	if d, err := time.ParseDuration(v); err == nil {
		return d, nil
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is neither a duration nor a number of seconds", v)
	}
	return time.Duration(n * float64(time.Second)), nil
}

// KernelClient asks a remote SafetyKernel over gRPC. It implements
// InputPolicy for nodes started with a kernel address.
//
// What it promises: a decision the kernel made is passed through as is
// (THROTTLE and REQUIRE_HUMAN included); no failure of the kernel or of
// the path to it is ever turned into a DENY. When there is no decision (a
// timeout, an error, an open circuit) the check either returns an error
// that errors.Is ErrUnavailable (fail closed) or allows with a warning
// (fail open). Safe for concurrent use.
type KernelClient struct {
	// Immutable after construction.
	cfg     KernelClientConfig
	log     *slog.Logger
	conn    *grpc.ClientConn
	kernel  capv1.SafetyKernelClient
	breaker *breaker
	cache   *decisionCache // nil: no cache
	m       *inputMetrics

	// Shared and safe.
	lastFailOpenLog atomic.Int64 // unix ms, to log fail-open once a second
}

// NewKernelClient builds a client. It does not dial: the connection is made
// on the first check (an unreachable kernel is an outage, not a startup
// error). Configuration errors (no address, contradictory TLS settings,
// plaintext to a remote address without Insecure) fail here.
func NewKernelClient(cfg KernelClientConfig) (*KernelClient, error) {
	if strings.TrimSpace(cfg.Addr) == "" {
		return nil, errors.New("safety: kernel client needs an address")
	}
	if v := os.Getenv(EnvFailMode); strings.TrimSpace(v) != "" {
		mode, err := parseFailMode(v)
		if err != nil {
			return nil, err
		}
		cfg.FailMode = mode
	}
	mode, err := parseFailMode(string(cfg.FailMode))
	if err != nil {
		return nil, err
	}
	cfg.FailMode = mode
	if cfg.Timeout <= 0 {
		cfg.Timeout = KernelTimeoutDefault
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	creds, err := cfg.TLS.Credentials(cfg.Addr)
	if err != nil {
		return nil, err
	}
	m, err := newInputMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds),
		// gRPC's default reconnect backoff grows to 120 s; a kernel back
		// from an outage must be found within seconds, not minutes.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: policyenv.ReconnectBackoff, MinConnectTimeout: cfg.Timeout})},
		cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("safety: kernel %s: %w", cfg.Addr, err)
	}
	log := cfg.Log.With("component", "safety-client", "kernel", cfg.Addr)
	c := &KernelClient{cfg: cfg, log: log, conn: conn, kernel: capv1.NewSafetyKernelClient(conn), m: m}
	c.breaker = newBreaker(cfg.Breaker, cfg.Redis, cfg.KeyPrefix+"safety:breaker:"+cfg.Addr, cfg.Timeout, cfg.Clock, log,
		func(s BreakerState) { m.breaker.Set(float64(s)) })
	if cfg.CacheTTL > 0 {
		c.cache = newDecisionCache(cfg.CacheTTL, cfg.CacheSize)
	}
	return c, nil
}

// Close closes the connection.
func (c *KernelClient) Close() error { return c.conn.Close() }

// FailMode is the mode in force (after the environment override).
func (c *KernelClient) FailMode() FailMode { return c.cfg.FailMode }

// BreakerState is the circuit's state as this process sees it.
func (c *KernelClient) BreakerState(ctx context.Context) BreakerState { return c.breaker.state(ctx) }

// Check asks the kernel about req; see KernelClient for what it promises.
func (c *KernelClient) Check(ctx context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	var key string
	if c.cache != nil {
		key = hashCheckRequest(req)
		if r := c.cache.get(key, req.GetJobId(), c.cfg.Clock()); r != nil {
			c.m.checks.WithLabelValues("cached_" + policyenv.DecisionLabel(r.Decision)).Inc()
			return r, nil
		}
	}
	p, ok := c.breaker.acquire(ctx)
	if !ok {
		return c.unavailable(req, &UnavailableError{BreakerOpen: true})
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	start := time.Now()
	resp, err := c.kernel.Check(cctx, req)
	cancel()
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// The caller gave up (not the kernel): no verdict on the
			// kernel, and no decision to make up either.
			return nil, &UnavailableError{Cause: ctx.Err()}
		}
		c.breaker.record(ctx, p, false)
		return c.unavailable(req, &UnavailableError{Cause: err})
	}
	c.m.latency.Observe(time.Since(start).Seconds())
	c.breaker.record(ctx, p, true)
	c.m.checks.WithLabelValues(policyenv.DecisionLabel(resp.Decision)).Inc()
	if c.cache != nil {
		c.cache.put(key, resp, c.cfg.Clock())
	}
	return resp, nil
}

func (c *KernelClient) unavailable(req *capv1.PolicyCheckRequest, uerr *UnavailableError) (*capv1.PolicyCheckResponse, error) {
	c.m.checks.WithLabelValues("unavailable").Inc()
	if c.cfg.FailMode != FailOpen {
		return nil, uerr
	}
	c.m.failOpen.WithLabelValues(c.m.topics.Value(req.GetTopic())).Inc()
	now := time.Now().UnixMilli()
	if last := c.lastFailOpenLog.Load(); now-last >= 1000 && c.lastFailOpenLog.CompareAndSwap(last, now) {
		c.log.Warn("safety kernel unavailable; allowing (fail mode open)", "job_id", req.GetJobId(),
			"topic", req.GetTopic(), "err", uerr)
	}
	return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW,
		Reason: "allowed without a policy decision (fail mode open): " + uerr.Error(),
		RuleId: RuleFailOpen, PolicySnapshot: SnapshotFailOpen}, nil
}

var _ safety.InputPolicy = (*KernelClient)(nil)
