package troupe_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/worker"
)

// warnings is a slog.Handler that passes each WARN record whose message
// starts with prefix, as its attributes by key, to got (without blocking).
type warnings struct {
	prefix string
	got    chan map[string]string
}

func (h *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *warnings) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *warnings) WithGroup(string) slog.Handler                { return h }

func (h *warnings) Handle(_ context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, h.prefix) {
		return nil
	}
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	select {
	case h.got <- attrs:
	default:
	}
	return nil
}

// TestWorkerBeatingTooSlowlyForTheWorkerTTLIsWarnedOfAndCounted: under a
// 1 s worker TTL, a `troupe worker` beating every 400 ms (three beats take
// longer than the TTL) is warned of by name with its interval, the TTL
// and what to change, counts in troupe_workers_heartbeat_too_slow{pool}
// and shows as too slow in the admin API's worker list; a worker beating
// every 100 ms is not warned of, not counted and not marked.
func TestWorkerBeatingTooSlowlyForTheWorkerTTLIsWarnedOfAndCounted(t *testing.T) {
	t.Parallel()
	warned := &warnings{prefix: "worker heartbeats too seldom", got: make(chan map[string]string, 16)}
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.WorkerTTL = time.Second
		c.Logger = slog.New(warned)
	})
	for _, w := range []struct {
		id    string
		every time.Duration
	}{{"fast", 100 * time.Millisecond}, {"slow", 400 * time.Millisecond}} {
		f.startWorkerWith(w.id, true, nil, worker.Echo, func(c *worker.Config) { c.Heartbeat = w.every })
	}
	var attrs map[string]string
	select {
	case attrs = <-warned.got:
	case <-time.After(15 * time.Second):
		t.Fatal("no warning about the worker beating every 400 ms under a 1 s TTL")
	}
	if attrs["worker_id"] != "slow" || attrs["pool"] != "echo" || attrs["worker_ttl"] != "1s" ||
		attrs["ttl_at_least"] == "" || attrs["beat_at_most"] != "333.333333ms" {
		t.Fatalf("warning %v, want worker slow, pool echo, TTL 1s and what to change", attrs)
	}
	if every, err := time.ParseDuration(attrs["heartbeat_interval"]); err != nil || every <= time.Second/3 {
		t.Fatalf("warned interval %q, want about 400ms (over a third of the TTL)", attrs["heartbeat_interval"])
	}

	// The gauge is set at the router's sweeps (every TTL/3).
	for deadline := time.Now().Add(10 * time.Second); counter(t, f.node, "troupe_workers_heartbeat_too_slow", "echo") != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("troupe_workers_heartbeat_too_slow{pool=echo} never 1")
		}
	}
	srv, err := admin.NewServer(admin.Config{Node: inspect.Of(f.node), Registry: f.node.Metrics(),
		Listen: "127.0.0.1:0", Log: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	list, err := admin.NewClient("http://"+srv.Addr(), "").Workers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, w := range list.Workers {
		switch w.ID {
		case "slow":
			seen++
			if !w.HeartbeatTooSlow || w.HeartbeatIntervalMS <= 333 {
				t.Fatalf("slow in /v1/workers: %+v, want too slow at about 400 ms", w)
			}
		case "fast":
			seen++
			if w.HeartbeatTooSlow || w.HeartbeatIntervalMS <= 0 {
				t.Fatalf("fast in /v1/workers: %+v, want its interval, not too slow", w)
			}
		}
	}
	if seen != 2 {
		t.Fatalf("/v1/workers = %+v, want both workers", list.Workers)
	}
	select {
	case attrs := <-warned.got:
		t.Fatalf("a second warning: %v", attrs)
	default:
	}
}

// TestWorkerTTLUnderThreeSDKHeartbeatsIsWarnedOfAtStart: a node whose
// worker TTL is under three of the CAP SDKs' 5 s heartbeats says so when
// it is built, with what to change; the default TTL says nothing.
func TestWorkerTTLUnderThreeSDKHeartbeatsIsWarnedOfAtStart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ttl  time.Duration
		warn bool
	}{{10 * time.Second, true}, {15 * time.Second, false}, {0, false}} {
		warned := &warnings{prefix: "worker TTL is under three heartbeats", got: make(chan map[string]string, 1)}
		if _, err := troupe.NewNode(troupe.Config{Logger: slog.New(warned), Tuning: troupe.Tuning{WorkerTTL: c.ttl}}); err != nil {
			t.Fatal(err)
		}
		select {
		case attrs := <-warned.got:
			if !c.warn || attrs["worker_ttl"] != "10s" || attrs["ttl_at_least"] != "15s" || attrs["beat_at_most"] != "3.333333333s" {
				t.Fatalf("TTL %v: warning %v", c.ttl, attrs)
			}
		default:
			if c.warn {
				t.Fatalf("TTL %v: no warning", c.ttl)
			}
		}
	}
}

func TestWorkerTTLNegativeIsRefused(t *testing.T) {
	t.Parallel()
	_, err := troupe.NewNode(troupe.Config{Tuning: troupe.Tuning{WorkerTTL: -time.Second}})
	if err == nil || !strings.Contains(err.Error(), "worker TTL -1s") {
		t.Fatalf("NewNode with a negative worker TTL: %v, want refused", err)
	}
}
