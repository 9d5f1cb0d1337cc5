package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	dto "github.com/prometheus/client_model/go"

	"github.com/troupe-run/troupe/internal/ratelimit"
)

// RateLimitConfig is a run of the rate limit bench (troupe-bench
// --rate-limit): Replicas limiters — the node component, each with its own
// Redis client, as on separate nodes — share one bucket of Rate tokens a
// second, and keep Waiting jobs queued between them for Duration; the run
// counts the grants and the bucket script's calls.
type RateLimitConfig struct {
	RedisURL string
	Replicas int
	Rate     int
	Waiting  int
	Duration time.Duration
	// Burst is the bucket's burst (0: Rate, the config's default).
	Burst int
	// Warm is the time before the measured window (the bucket's burst is
	// spent in it).
	Warm time.Duration
}

// RateLimitResult is what a run measured.
type RateLimitResult struct {
	Replicas    int     `json:"replicas"`
	Waiting     int     `json:"waiting"`
	Limit       int     `json:"limit_per_s"`
	Burst       int     `json:"burst"`
	Seconds     float64 `json:"seconds"`
	Granted     int64   `json:"granted"`
	Rate        float64 `json:"granted_per_s"`
	ErrorPct    float64 `json:"error_pct"`
	Calls       float64 `json:"script_calls"`
	CallsPerSec float64 `json:"script_calls_per_s"`
	// PerReplica is each replica's share of the grants.
	PerReplica []int64 `json:"granted_per_replica"`
}

func (r *RateLimitResult) String() string {
	return fmt.Sprintf("rate limit %d/s (burst %d), %d replicas, %d jobs waiting: %d granted in %.1f s = %.2f/s (%+.2f %%), "+
		"%.0f script calls = %.1f/s; per replica %v", r.Limit, r.Burst, r.Replicas, r.Waiting, r.Granted, r.Seconds, r.Rate,
		r.ErrorPct, r.Calls, r.CallsPerSec, r.PerReplica)
}

// RateLimit runs the rate limit bench.
func RateLimit(ctx context.Context, cfg RateLimitConfig) (*RateLimitResult, error) {
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, err
	}
	prefix := "rlbench" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	burst := cfg.Burst
	if burst <= 0 {
		burst = cfg.Rate
	}
	bucket := func() *ratelimit.Spec {
		s, _ := ratelimit.Parse(fmt.Appendf(nil, "rate_limits:\n  bench:\n    limit: %d\n    per: 1s\n    burst: %d\n",
			cfg.Rate, burst))
		return s
	}
	var (
		measuring atomic.Bool
		granted   = make([]atomic.Int64, cfg.Replicas)
		limiters  []*ratelimit.Limiter
		metrics   []*ratelimit.Metrics
		clients   []*redis.Client
		seq       atomic.Int64
		wg        sync.WaitGroup
	)
	defer func() {
		for _, l := range limiters {
			_ = l.Stop(context.Background())
		}
		if len(clients) > 0 {
			clients[0].Del(context.Background(), prefix+"{rl:bench}")
		}
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	for i := range cfg.Replicas {
		c := redis.NewClient(opt)
		clients = append(clients, c)
		m, _ := ratelimit.NewMetrics(nil)
		metrics = append(metrics, m)
		limiters = append(limiters, ratelimit.New(ratelimit.Config{Spec: bucket(), Store: ratelimit.NewStore(c, prefix),
			NodeID: "bench-" + strconv.Itoa(i), Metrics: m}))
	}
	// Each replica keeps its share of the waiting jobs queued: a granted
	// job is replaced by a new one at the back.
	var add func(i int)
	add = func(i int) {
		job := "j" + strconv.FormatInt(seq.Add(1), 36)
		limiters[i].Take(job, "bench", 1, 1, func(ok bool, _ string) {
			if !ok {
				return
			}
			if measuring.Load() {
				granted[i].Add(1)
			}
			go add(i)
		})
	}
	for i := range cfg.Replicas {
		for range cfg.Waiting / cfg.Replicas {
			add(i)
		}
	}
	for _, l := range limiters {
		if err := l.Start(ctx); err != nil {
			return nil, err
		}
	}
	select {
	case <-time.After(cfg.Warm):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	calls0 := sumCalls(metrics)
	measuring.Store(true)
	start := time.Now()
	select {
	case <-time.After(cfg.Duration):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	measuring.Store(false)
	secs := time.Since(start).Seconds()
	calls := sumCalls(metrics) - calls0
	wg.Wait()
	res := &RateLimitResult{Replicas: cfg.Replicas, Waiting: cfg.Waiting, Limit: cfg.Rate, Burst: burst, Seconds: secs, Calls: calls,
		CallsPerSec: calls / secs}
	for i := range granted {
		n := granted[i].Load()
		res.Granted += n
		res.PerReplica = append(res.PerReplica, n)
	}
	res.Rate = float64(res.Granted) / secs
	res.ErrorPct = 100 * (res.Rate - float64(cfg.Rate)) / float64(cfg.Rate)
	return res, nil
}

func sumCalls(ms []*ratelimit.Metrics) float64 {
	total := 0.0
	for _, m := range ms {
		var d dto.Metric
		if err := m.Calls.WithLabelValues("bench", "ok").Write(&d); err == nil {
			total += d.GetCounter().GetValue()
		}
	}
	return total
}
