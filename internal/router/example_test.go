package router_test

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/router"
)

// Example_node shows how a node wires the router and its goroutine-side
// helpers: the pools watcher (file changes, SIGHUP, runtime mappings from
// Redis), the snapshot writer (warm start, single writer across replicas)
// and the eviction hook.
func Example_node() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	sys := actor.NewActorSystem()
	log := slog.Default()
	const keyPrefix, nodeID = "troupe:", "node-a"

	// 1. Pool config: the file, with runtime mappings laid over it.
	mappings := router.NewMappingStore(rdb, keyPrefix)
	watcher, err := router.NewPoolsWatcher(router.PoolsWatcherConfig{Path: "pools.yaml", Mappings: mappings, Log: log})
	if err != nil {
		panic(err)
	}
	pools, err := watcher.Load(ctx)
	if err != nil {
		panic(err) // no good config to start with
	}

	// 2. The router, with metrics and the eviction hook.
	evicted := make(chan string, 1024)
	pid := sys.Root.SpawnPrefix(router.Props(router.Config{
		Pools:   pools,
		Metrics: prometheus.NewRegistry(),
		Log:     log,
		OnEvict: func(workerID string) {
			select { // never block the router
			case evicted <- workerID:
			default:
			}
		},
	}), "router")
	watcher.Start(sys.Root, pid)

	// 3. Warm start before consuming submits, then keep the snapshot fresh.
	snap, err := router.NewSnapshotWriter(router.SnapshotWriterConfig{
		Redis: rdb, Prefix: keyPrefix, NodeID: nodeID, Root: sys.Root, Router: pid, Log: log})
	if err != nil {
		panic(err)
	}
	snap.WarmStart(ctx)
	snap.Start()

	// 4. SIGHUP reloads pools.yaml now.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			_ = watcher.Reload() // logged by the watcher; the old config stays on error
		}
	}()

	// A CLI or API maps a topic at runtime; every replica's watcher sees it.
	_ = mappings.Set(ctx, "job.new", "gpu")

	// Shutdown: the helpers first, then the router.
	signal.Stop(hup)
	snap.Stop()
	watcher.Stop()
	_ = sys.Root.PoisonFuture(pid).Wait()
}
