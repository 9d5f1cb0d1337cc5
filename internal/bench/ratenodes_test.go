package bench

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/testenv"
)

// TestRateNodesSmoke runs the rate limit bench through two in-process
// nodes with small numbers: jobs labelled with the bench's bucket are
// dispatched in the window, none twice, the backlog is
// kept, both Redis figures are read, and the run leaves no keys or
// streams behind. No timing bound: the rate itself is a benchmark's.
func TestRateNodesSmoke(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := RateNodesConfig{RedisURL: env.RedisURL, NATSURL: env.NATSURL, Nodes: 2, Workers: 2, Rate: 20, Waiting: 30,
		Duration: 2 * time.Second, Warm: time.Second, Node: NodeInProcess, RunID: env.Prefix + "rn",
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := RateNodes(ctx, cfg)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	t.Log(res)
	if len(res.PerSecond) != 2 || res.Dispatched < 1 || res.Dispatched != res.PerSecond[0]+res.PerSecond[1] {
		t.Errorf("want 2 seconds counted and jobs dispatched in them, got %v (%d)", res.PerSecond, res.Dispatched)
	}
	if res.Duplicates != 0 {
		t.Errorf("%d jobs received twice", res.Duplicates)
	}
	if res.WaitingMax < 1 || res.WaitingMax > int64(cfg.Waiting) {
		t.Errorf("backlog held %d..%d, want within 1..%d", res.WaitingMin, res.WaitingMax, cfg.Waiting)
	}
	// The embedded store keeps no command statistics (INFO commandstats):
	// there only the nodes' own count is read.
	if res.ServerCommands <= 0 && !env.RedisEmbedded() || res.NodeCommands <= 0 {
		t.Errorf("Redis commands not read: server %d, nodes %d", res.ServerCommands, res.NodeCommands)
	}
	pfx := PrefixesFor(cfg.RunID)
	if keys, err := env.Redis.Keys(ctx, pfx.Key+"*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("keys left behind: %d (%v)", len(keys), err)
	}
	js, _ := jetstream.New(env.NATS)
	if _, err := js.Stream(ctx, bus.StreamName(pfx.Stream, bus.StreamSubmit)); err == nil {
		t.Errorf("stream %s left behind", bus.StreamName(pfx.Stream, bus.StreamSubmit))
	}
}

// TestRateNodesRefusesBadConfig: a run without nodes or waiting jobs is a
// configuration error, before anything starts.
func TestRateNodesRefusesBadConfig(t *testing.T) {
	for _, c := range []RateNodesConfig{{}, {Nodes: 1, Workers: 1, Rate: 1, Waiting: 0, Duration: time.Second}} {
		if _, err := RateNodes(context.Background(), c); err == nil {
			t.Errorf("%+v: want a config error", c)
		}
	}
}
