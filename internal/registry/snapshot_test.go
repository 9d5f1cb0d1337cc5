package registry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/testenv"
)

func TestSnapshotRoundTripHydratesWithLastSeenNow(t *testing.T) {
	t.Parallel()
	src := New(time.Minute)
	for i, id := range []string{"w1", "w2", "w3"} {
		hb := beat(id, "p")
		hb.ActiveJobs, hb.CpuLoad = int32(i), 10
		hb.Labels = map[string]string{LabelDispatch: DispatchDirect, "zone": "a"}
		src.Observe(hb, t0)
	}
	// w3 went quiet: it must not be in the snapshot.
	src.Observe(beat("w3", "p"), t0.Add(-2*time.Minute))
	data, err := EncodeSnapshot("node-a", t0, src.Snapshot(t0.Add(time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := DecodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Node != "node-a" || len(snap.Workers) != 2 {
		t.Fatalf("snapshot = %+v, want 2 workers from node-a", snap)
	}

	dst := New(time.Minute)
	// A live heartbeat that arrived before hydration wins over the snapshot.
	live := beat("w2", "p")
	live.ActiveJobs = 7
	hydrateAt := t0.Add(time.Hour)
	dst.Observe(live, hydrateAt.Add(-time.Second))
	if n := dst.Hydrate(snap.Workers, hydrateAt); n != 1 {
		t.Fatalf("hydrated %d, want 1 (w2 is already live)", n)
	}
	w1 := dst.Get("w1")
	if w1 == nil || !w1.LastSeen.Equal(hydrateAt) || !w1.Direct || w1.Labels["zone"] != "a" {
		t.Fatalf("hydrated w1 = %+v, want last seen = hydration time, direct, zone=a", w1)
	}
	if !dst.Live(w1, hydrateAt.Add(59*time.Second)) {
		t.Fatal("hydrated worker not live within the TTL")
	}
	if got := dst.Get("w2").ActiveJobs; got != 7 {
		t.Fatalf("w2 active = %d, want the live heartbeat's 7", got)
	}
	if top := dst.Top("p"); top == nil || top.ID != "w1" {
		t.Fatal("hydrated worker not placeable")
	}
}

func TestSnapshotHydratedWorkerKeepsItsIntervalAndLearnsNothingFromHydration(t *testing.T) {
	t.Parallel()
	r := New(TTLDefault)
	r.Hydrate([]Entry{{ID: "w1", Pool: "p", IntervalMS: 2000}}, t0)
	w := r.Get("w1")
	if w.Interval != 2*time.Second || r.Live(w, t0.Add(7*time.Second)) {
		t.Fatal("hydrated worker lost its known interval")
	}
	// The first beat comes 100 ms after hydration: not an interval.
	r.Observe(beat("w1", "p"), t0.Add(100*time.Millisecond))
	r.Observe(beat("w1", "p"), t0.Add(2100*time.Millisecond))
	if w.Interval != 2*time.Second {
		t.Fatalf("interval = %v, want 2s kept", w.Interval)
	}
}

func TestDecodeSnapshotRejectsDamage(t *testing.T) {
	t.Parallel()
	for name, data := range map[string]string{
		"not json":      "{garbage",
		"other version": `{"v":99,"workers":[]}`,
		"no id":         `{"v":1,"workers":[{"pool":"p"}]}`,
	} {
		if _, err := DecodeSnapshot([]byte(data)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: err = %v, want ErrCorruptSnapshot", name, err)
		}
	}
}

func TestSnapshotStoreSingleWriter(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a := NewSnapshotStore(env.Redis, env.KeyPrefix())
	b := NewSnapshotStore(env.Redis, env.KeyPrefix())

	if _, err := a.Read(ctx); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("read before any write: %v, want ErrNoSnapshot", err)
	}
	if ok, err := a.Acquire(ctx, "node-a", time.Minute); err != nil || !ok {
		t.Fatalf("node-a acquire = %v, %v", ok, err)
	}
	if ok, err := b.Acquire(ctx, "node-b", time.Minute); err != nil || ok {
		t.Fatalf("node-b acquired a held lock (%v, %v)", ok, err)
	}
	if ok, err := a.Acquire(ctx, "node-a", time.Minute); err != nil || !ok {
		t.Fatalf("node-a renew = %v, %v", ok, err)
	}
	// The write is fenced by the lock inside Redis.
	if ok, err := b.Write(ctx, "node-b", []byte("from b"), time.Minute); err != nil || ok {
		t.Fatalf("node-b wrote without the lock (%v, %v)", ok, err)
	}
	if ok, err := a.Write(ctx, "node-a", []byte("from a"), time.Minute); err != nil || !ok {
		t.Fatalf("node-a write = %v, %v", ok, err)
	}
	if got, err := b.Read(ctx); err != nil || string(got) != "from a" {
		t.Fatalf("read = %q, %v", got, err)
	}
	// Releasing hands over at once; releasing someone else's lock does nothing.
	if err := b.Release(ctx, "node-b"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := b.Acquire(ctx, "node-b", time.Minute); ok {
		t.Fatal("node-b's release freed node-a's lock")
	}
	if err := a.Release(ctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Acquire(ctx, "node-b", time.Minute); err != nil || !ok {
		t.Fatalf("node-b could not take the released lock (%v, %v)", ok, err)
	}
}
