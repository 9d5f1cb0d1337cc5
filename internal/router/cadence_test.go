package router

import (
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/proto/capv1"
)

const slowWarning = "heartbeats too seldom"

// TestRouterWarnsOfAWorkerTooSlowForTheTTL: under a 10 s worker TTL, a
// stock worker beating every 5 s gets one warning naming its interval,
// the TTL and what to change, counts in troupe_workers_heartbeat_too_slow
// and shows its interval and the verdict in the worker list; a worker
// beating every 2 s does none of that. The warning comes again only
// SlowBeatWarnEvery later.
func TestRouterWarnsOfAWorkerTooSlowForTheTTL(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	reg := prometheus.NewRegistry()
	t0 := time.Now()
	clock := newFakeClock(t0)
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 10 * time.Second,
		SweepEach: time.Second, Now: clock.now, Log: log, Metrics: reg})
	var last time.Time
	for s := 0; s <= 20; s++ {
		last = t0.Add(time.Duration(s) * time.Second)
		if s%5 == 0 {
			b.beat(&capv1.Heartbeat{WorkerId: "slow", Pool: "a"}, last)
		}
		if s%2 == 0 {
			b.beat(&capv1.Heartbeat{WorkerId: "fast", Pool: "a"}, last)
		}
		b.sweepAt(t, clock, last)
	}
	out := buf.String()
	if n := strings.Count(out, slowWarning); n != 1 {
		t.Fatalf("%d warnings, want 1; log %q", n, out)
	}
	for _, want := range []string{"worker_id=slow", "pool=a", "heartbeat_interval=5s", "worker_ttl=10s",
		"beat_at_most=3.333333333s", "ttl_at_least=15s"} {
		if !strings.Contains(out, want) {
			t.Fatalf("warning lacks %s: %q", want, out)
		}
	}
	if got := metricSum(t, reg, "troupe_workers_heartbeat_too_slow", map[string]string{"pool": "a"}); got != 1 {
		t.Fatalf("troupe_workers_heartbeat_too_slow{pool=a} = %v, want 1", got)
	}
	ws := b.workers(t)
	if len(ws) != 2 || ws[0].ID != "fast" || ws[0].TooSlow || ws[0].Interval != 2*time.Second ||
		ws[1].ID != "slow" || !ws[1].TooSlow || ws[1].Interval != 5*time.Second {
		t.Fatalf("workers = %+v, want fast (2s, fine) and slow (5s, too slow)", ws)
	}

	// Still too slow a while later: no second warning yet; one once
	// SlowBeatWarnEvery has passed since the first.
	warnedAt := t0.Add(20 * time.Second)
	b.beat(&capv1.Heartbeat{WorkerId: "slow", Pool: "a"}, last.Add(5*time.Second))
	b.workers(t)
	if n := strings.Count(buf.String(), slowWarning); n != 1 {
		t.Fatalf("%d warnings 5 s after the first, want 1", n)
	}
	b.beat(&capv1.Heartbeat{WorkerId: "slow", Pool: "a"}, warnedAt.Add(SlowBeatWarnEvery))
	b.workers(t)
	if n := strings.Count(buf.String(), slowWarning); n != 2 {
		t.Fatalf("%d warnings SlowBeatWarnEvery after the first, want 2", n)
	}
}

// TestRouterWarnsOfAWorkerEvictedBetweenBeats: under a 3 s TTL a stock
// worker beating every 5 s is evicted between any two beats and joins
// again at the next; the router still learns its interval across the
// evictions and warns about it.
func TestRouterWarnsOfAWorkerEvictedBetweenBeats(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	t0 := time.Now()
	clock := newFakeClock(t0)
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 3 * time.Second,
		SweepEach: time.Second, Now: clock.now, Log: log})
	for s := 0; s <= 20; s++ {
		at := t0.Add(time.Duration(s) * time.Second)
		if s%5 == 0 {
			b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "a"}, at)
		}
		b.sweepAt(t, clock, at)
	}
	out := buf.String()
	if n := strings.Count(out, "worker evicted"); n != 4 {
		t.Fatalf("%d evictions, want 4 (one between each two beats); log %q", n, out)
	}
	if n := strings.Count(out, slowWarning); n != 1 || !strings.Contains(out, "heartbeat_interval=5s") {
		t.Fatalf("%d warnings, want 1 naming the 5 s interval; log %q", n, out)
	}
}

// TestRouterBoundsTheTooSlowWarnings: a fleet too slow for the TTL gets
// SlowBeatWarnMax warnings naming workers and one saying the rest are
// counted; all of them count in the gauge.
func TestRouterBoundsTheTooSlowWarnings(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	reg := prometheus.NewRegistry()
	t0 := time.Now()
	clock := newFakeClock(t0)
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 10 * time.Second,
		SweepEach: time.Second, Now: clock.now, Log: log, Metrics: reg})
	const fleet = SlowBeatWarnMax + 20
	for s := 0; s <= 20; s++ { // a sweep a second: a longer gap is a pause of the node's
		at := t0.Add(time.Duration(s) * time.Second)
		if s%5 == 0 { // every worker beats every 5 s
			for i := range fleet {
				b.beat(&capv1.Heartbeat{WorkerId: "w" + strconv.Itoa(i), Pool: "a"}, at)
			}
		}
		b.sweepAt(t, clock, at)
	}
	out := buf.String()
	if n := strings.Count(out, slowWarning); n != SlowBeatWarnMax {
		t.Fatalf("%d workers named, want %d", n, SlowBeatWarnMax)
	}
	if n := strings.Count(out, "more workers heartbeat too seldom"); n != 1 {
		t.Fatalf("%d lines about the rest, want 1", n)
	}
	if got := metricSum(t, reg, "troupe_workers_heartbeat_too_slow", map[string]string{"pool": "a"}); got != fleet {
		t.Fatalf("troupe_workers_heartbeat_too_slow{pool=a} = %v, want %d", got, fleet)
	}
}
