package router

import (
	"context"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
)

const snapPools = "topics: {job.a: a}\n"

func newWriter(t *testing.T, env *testenv.Env, node string, b *routerBundle, mutate ...func(*SnapshotWriterConfig)) *SnapshotWriter {
	t.Helper()
	cfg := SnapshotWriterConfig{Redis: env.Redis, Prefix: env.KeyPrefix(), NodeID: node,
		Root: b.sys.Root, Router: b.pid, Log: testLog()}
	for _, m := range mutate {
		m(&cfg)
	}
	w, err := NewSnapshotWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

func TestSnapshotWarmStartVsColdStart(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()

	// Node A knows three workers and writes the snapshot.
	a := setupRouter(t, Config{Pools: mustPools(t, snapPools)})
	for _, id := range []string{"w1", "w2", "w3"} {
		a.beat(&capv1.Heartbeat{WorkerId: id, Pool: "a", ActiveJobs: 1}, time.Now())
	}
	a.workers(t) // the heartbeats are in
	if ok, err := newWriter(t, env, "node-a", a).WriteOnce(ctx); err != nil || !ok {
		t.Fatalf("node-a write = %v, %v", ok, err)
	}

	// Node B restarts warm: it can place before any heartbeat. A live
	// heartbeat that beat the snapshot in wins.
	warm := setupRouter(t, Config{Pools: mustPools(t, snapPools)})
	warm.beat(&capv1.Heartbeat{WorkerId: "w2", Pool: "a", ActiveJobs: 7}, time.Now())
	before := time.Now()
	if n := newWriter(t, env, "node-b", warm).WarmStart(ctx); n != 2 {
		t.Fatalf("warm start hydrated %d, want 2 (w2 came live)", n)
	}
	ws := warm.workers(t)
	if len(ws) != 3 {
		t.Fatalf("warm node knows %d workers, want 3", len(ws))
	}
	for _, w := range ws {
		if w.ID == "w2" && w.ActiveJobs != 7 {
			t.Fatalf("w2 active = %d, want the live heartbeat's 7", w.ActiveJobs)
		}
		if w.ID != "w2" && w.LastSeen.Before(before) {
			t.Fatalf("%s last seen %v, want the hydration time", w.ID, w.LastSeen)
		}
	}
	if r := warm.pick(t, "job.a"); r.Reason != "" || r.WorkerID == "w2" {
		t.Fatalf("warm pick = %+v, want w1 or w3", r)
	}

	// Node C finds no snapshot under its prefix: cold start, no_workers.
	cold := setupRouter(t, Config{Pools: mustPools(t, snapPools)})
	coldEnv := testenv.New(t)
	if n := newWriter(t, coldEnv, "node-c", cold).WarmStart(ctx); n != 0 {
		t.Fatalf("cold start hydrated %d", n)
	}
	if r := cold.pick(t, "job.a"); r.Reason != jobstate.ReasonNoWorkers {
		t.Fatalf("cold pick reason = %q, want no_workers", r.Reason)
	}
}

func TestSnapshotCorruptMeansColdStart(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	store := registry.NewSnapshotStore(env.Redis, env.KeyPrefix())
	if ok, err := store.Acquire(ctx, "vandal", time.Minute); err != nil || !ok {
		t.Fatal("lock", ok, err)
	}
	if ok, err := store.Write(ctx, "vandal", []byte(`{"v":1,"workers":[{"pool":`), time.Minute); err != nil || !ok {
		t.Fatal("write", ok, err)
	}
	b := setupRouter(t, Config{Pools: mustPools(t, snapPools)})
	if n := newWriter(t, env, "node-b", b).WarmStart(ctx); n != 0 {
		t.Fatalf("corrupt snapshot hydrated %d", n)
	}
	if ws := b.workers(t); len(ws) != 0 {
		t.Fatalf("workers after corrupt snapshot: %+v", ws)
	}
}

func TestSnapshotExactlyOneReplicaWrites(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	ra := setupRouter(t, Config{Pools: mustPools(t, snapPools)})
	rb := setupRouter(t, Config{Pools: mustPools(t, snapPools)})
	wa, wb := newWriter(t, env, "node-a", ra), newWriter(t, env, "node-b", rb)

	if ok, err := wa.WriteOnce(ctx); err != nil || !ok {
		t.Fatalf("node-a = %v, %v", ok, err)
	}
	for range 3 {
		if ok, err := wb.WriteOnce(ctx); err != nil || ok {
			t.Fatalf("node-b wrote while node-a holds the lock (%v, %v)", ok, err)
		}
		if ok, err := wa.WriteOnce(ctx); err != nil || !ok {
			t.Fatalf("node-a lost its lock (%v, %v)", ok, err)
		}
	}
	wa.Stop() // releases the lock: node-b takes over at once
	if ok, err := wb.WriteOnce(ctx); err != nil || !ok {
		t.Fatalf("node-b after node-a stopped = %v, %v", ok, err)
	}
}

func TestSnapshotWriterLoopWrites(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	b := setupRouter(t, Config{Pools: mustPools(t, snapPools)})
	b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "a"}, time.Now())
	w := newWriter(t, env, "node-a", b, func(c *SnapshotWriterConfig) { c.Every = 10 * time.Millisecond })
	w.Start()
	store := registry.NewSnapshotStore(env.Redis, env.KeyPrefix())
	deadline := time.Now().Add(5 * time.Second)
	for {
		snap, err := store.Load(context.Background())
		if err == nil && len(snap.Workers) == 1 && snap.Node == "node-a" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no snapshot written within 5 s (last: %+v, %v)", snap, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	w.Stop()
	w.Stop() // idempotent
}
