package router

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/proto/capv1"
)

func mustPools(t *testing.T, yaml string) *PoolConfig {
	t.Helper()
	cfg, err := ParsePools([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestRouterAnswersPicksFromHeartbeats(t *testing.T) {
	t.Parallel()
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\npools: {a: {dispatch: direct}}\n"),
		Direct: func(id string) string { return "p.worker." + id + ".jobs" }})
	b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "a",
		Labels: map[string]string{registry.LabelDispatch: registry.DispatchDirect}}, time.Now())
	r := b.pick(t, "job.a")
	if r.Reason != "" || r.WorkerID != "w1" || r.Subject != "p.worker.w1.jobs" || r.Epoch != 7 {
		t.Fatalf("reply = %+v", r)
	}
	if ws := b.workers(t); len(ws) != 1 || ws[0].Dispatched != 1 {
		t.Fatalf("workers = %+v, want w1 with one dispatch", ws)
	}
}

func TestRouterSetPoolsTakesEffect(t *testing.T) {
	t.Parallel()
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n")})
	b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "b"}, time.Now())
	if r := b.pick(t, "job.b"); r.Reason != jobstate.ReasonTopicUnmapped {
		t.Fatalf("reason = %q, want topic_unmapped", r.Reason)
	}
	b.sys.Root.Send(b.pid, &SetPools{Config: mustPools(t, "topics: {job.b: b}\n")})
	if r := b.pick(t, "job.b"); r.WorkerID != "w1" {
		t.Fatalf("reply after SetPools = %+v", r)
	}
}

func TestRouterSweepEvictsNotifiesAndCounts(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	evicted := make(chan string, 4)
	ttl := 200 * time.Millisecond
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: ttl, SweepEach: 10 * time.Millisecond,
		Metrics: reg, OnEvict: func(id string) { evicted <- id }})
	now := time.Now()
	b.beat(&capv1.Heartbeat{WorkerId: "stays", Pool: "a"}, now.Add(time.Hour)) // never expires in this test
	b.beat(&capv1.Heartbeat{WorkerId: "goes", Pool: "a"}, now)
	select {
	case id := <-evicted:
		if id != "goes" {
			t.Fatalf("evicted %s, want goes", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no eviction within 5 s")
	}
	// The gauge is set after the eviction, in the same sweep: ask the router
	// once more so that sweep is surely over.
	if ws := b.workers(t); len(ws) != 1 || ws[0].ID != "stays" {
		t.Fatalf("workers after sweep = %+v", ws)
	}
	if got := metricSum(t, reg, "troupe_live_workers", map[string]string{"pool": "a"}); got != 1 {
		t.Fatalf("troupe_live_workers{pool=a} = %v, want 1", got)
	}
	if got := metricSum(t, reg, "troupe_workers_evicted_total", map[string]string{"pool": "a"}); got != 1 {
		t.Fatalf("troupe_workers_evicted_total{pool=a} = %v, want 1", got)
	}
}

func TestRouterStaleRetriesAreCountedAndLeaveStaleWorker(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	// A long sweep period keeps the stale workers in the registry, as
	// between two sweeps.
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), SweepEach: time.Hour, StaleRetries: 2,
		Metrics: reg})
	old := time.Now().Add(-time.Minute) // past the 30 s TTL
	for _, id := range []string{"d1", "d2", "d3", "d4"} {
		b.beat(&capv1.Heartbeat{WorkerId: id, Pool: "a"}, old)
	}
	r := b.pick(t, "job.a")
	if r.Reason != jobstate.ReasonStaleWorker {
		t.Fatalf("reason = %q (%s), want stale_worker", r.Reason, r.Detail)
	}
	if got := metricSum(t, reg, "troupe_stale_worker_retry_total", map[string]string{"topic": "job.a"}); got != 3 {
		t.Fatalf("troupe_stale_worker_retry_total{topic=job.a} = %v, want 3 (first pick + 2 re-picks)", got)
	}
	// The fourth dead worker is met by the next pick; with none left live the
	// reason is still stale_worker, not no_workers.
	if r := b.pick(t, "job.a"); r.Reason != jobstate.ReasonStaleWorker {
		t.Fatalf("second reason = %q, want stale_worker", r.Reason)
	}
	if got := metricSum(t, reg, "troupe_stale_worker_retry_total", map[string]string{"worker": "d4"}) +
		metricSum(t, reg, "troupe_stale_worker_retry_total", map[string]string{"worker": "d1"}); got != 2 {
		t.Fatalf("per-worker series d1+d4 = %v, want 2", got)
	}
}

func TestRouterMetricsShareARegisterer(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	setupRouter(t, Config{Metrics: reg})
	b := setupRouter(t, Config{Metrics: reg, Pools: mustPools(t, "topics: {job.a: a}\n"), SweepEach: time.Hour})
	b.beat(&capv1.Heartbeat{WorkerId: "d1", Pool: "a"}, time.Now().Add(-time.Minute))
	b.pick(t, "job.a")
	if got := metricSum(t, reg, "troupe_stale_worker_retry_total", nil); got != 1 {
		t.Fatalf("second router's metrics not registered: %v", got)
	}
}

// TestRouterPauseEvictsNobody: a sweep that finds the router did not run
// for a long while (the process was paused) evicts no worker and forgets
// no replica — their heartbeats and reports are only now arriving — and
// the next regular sweep does.
func TestRouterPauseEvictsNobody(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	t0 := time.Now()
	clock.Store(t0.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	evicted := make(chan string, 4)
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 5 * time.Second,
		SweepEach: 2 * time.Second, Now: now, OnEvict: func(id string) { evicted <- id }})
	b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "a"}, t0)
	b.sys.Root.Send(b.pid, sweepTick{})
	b.workers(t)                                     // the router has swept at t0
	clock.Store(t0.Add(30 * time.Second).UnixNano()) // paused 30 s: w1 looks 25 s overdue
	b.sys.Root.Send(b.pid, sweepTick{})
	b.workers(t) // and has swept again
	select {
	case id := <-evicted:
		t.Fatalf("%s evicted by the sweep right after a pause", id)
	default:
	}
	clock.Store(t0.Add(31 * time.Second).UnixNano()) // a regular second later, still no heartbeat
	b.sys.Root.Send(b.pid, sweepTick{})
	select {
	case id := <-evicted:
		if id != "w1" {
			t.Fatalf("evicted %s", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("w1 never evicted after the pause")
	}
}

// TestRouterNATSOutageEvictsNobody: while this node's NATS connection is
// down, and at the first sweep after it reconnects, no worker is evicted
// for the silence the node could not have heard; a worker that stays
// silent for a whole window after the reconnect is, once StallReconnect
// has passed since the stall too (it may still be reconnecting).
func TestRouterNATSOutageEvictsNobody(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	t0 := time.Now()
	clock.Store(t0.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	var up atomic.Bool
	var reconnects atomic.Uint64
	up.Store(true)
	evicted := make(chan string, 4)
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 5 * time.Second,
		SweepEach: 2 * time.Second, Now: now, OnEvict: func(id string) { evicted <- id },
		Link: func() (bool, uint64) { return up.Load(), reconnects.Load() }})
	b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "a"}, t0)
	sweepAt := func(d time.Duration) {
		clock.Store(t0.Add(d).UnixNano())
		b.sys.Root.Send(b.pid, sweepTick{})
		b.workers(t) // the sweep has run
	}
	noEviction := func(when string) {
		t.Helper()
		select {
		case id := <-evicted:
			t.Fatalf("%s evicted %s", when, id)
		default:
		}
	}
	sweepAt(0)
	up.Store(false) // the connection drops; sweeps go on, a second apart
	for s := 1; s <= 9; s++ {
		sweepAt(time.Duration(s) * time.Second)
	}
	noEviction("a sweep while the connection was down")
	up.Store(true)
	reconnects.Add(1)
	sweepAt(10 * time.Second) // w1 last beat 10 s ago, twice its TTL
	noEviction("the first sweep after the reconnect")
	sweepAt(14 * time.Second) // within the TTL counted from the reconnect
	noEviction("a sweep within the window after the reconnect")
	sweepAt(16 * time.Second) // a whole TTL of silence since the reconnect
	noEviction("a sweep within StallReconnect of the stall")
	sweepAt(10*time.Second + StallReconnect)
	select {
	case id := <-evicted:
		if id != "w1" {
			t.Fatalf("evicted %s", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("w1 never evicted after a whole window of silence since the reconnect")
	}
}

// TestStockCAPUnknownPoolIsWarnedOf: a worker that heartbeats the topic's
// name as its pool gets one warning naming the real pool, is counted
// (troupe_workers_unrouted) and shown as unrouted, and a job that waits
// no_workers says why in its detail.
func TestStockCAPUnknownPoolIsWarnedOf(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	reg := prometheus.NewRegistry()
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a, job.b: b}\n"), Log: log, Metrics: reg})
	b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "job.a"}, time.Now())
	b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "job.a"}, time.Now())
	b.beat(&capv1.Heartbeat{WorkerId: "w2", Pool: "a"}, time.Now())
	b.sys.Root.Send(b.pid, sweepTick{})
	ws := b.workers(t)
	out := buf.String()
	if n := strings.Count(out, "no topic routes to"); n != 1 || !strings.Contains(out, "worker_id=w1") ||
		!strings.Contains(out, "routed to pool(s) a") {
		t.Fatalf("log = %q, want one warning for w1 naming pool a", out)
	}
	if len(ws) != 2 || ws[0].ID != "w2" || !ws[0].Routed || ws[1].ID != "w1" || ws[1].Routed {
		t.Fatalf("workers = %+v, want w2 routed and w1 not", ws)
	}
	if got := metricSum(t, reg, "troupe_workers_unrouted", nil); got != 1 {
		t.Fatalf("troupe_workers_unrouted = %v, want 1", got)
	}
	if r := b.pick(t, "job.b"); r.Reason != jobstate.ReasonNoWorkers || !strings.Contains(r.Detail, "job.a") {
		t.Fatalf("pick for job.b = %+v, want no_workers naming the stray pool job.a", r)
	}
}

// TestStockCAPDirectPoolUsesThePoolSubject: a pool forced to direct
// dispatch sends a worker that does not listen on its direct subject its
// jobs on the pool subject, and warns once.
func TestStockCAPDirectPoolUsesThePoolSubject(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\npools: {a: {dispatch: direct}}\n"), Log: log})
	b.beat(&capv1.Heartbeat{WorkerId: "stock", Pool: "a"}, time.Now())
	for range 2 {
		if r := b.pick(t, "job.a"); r.WorkerID != "stock" || r.Subject != "job.a" {
			t.Fatalf("pick = %+v, want stock on the pool subject job.a", r)
		}
	}
	if n := strings.Count(buf.String(), "forces direct dispatch"); n != 1 {
		t.Fatalf("log = %q, want one warning", buf.String())
	}
}

// syncBuffer is a bytes.Buffer safe for the router's goroutine and the test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
