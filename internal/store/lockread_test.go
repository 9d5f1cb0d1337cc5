package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// TestLockReads: LockHolders reads each job's lock in order ("" for none);
// LockRemaining says how long a lock has left: its TTL; for a parked lock,
// its node's lease in the job's shard (0 once the lease has lapsed); -1 for
// a lock with no TTL that is not parked; 0 for no lock — against a real
// Redis.
func TestLockReads(t *testing.T) {
	env := testenv.New(t)
	s := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	ctx := context.Background()
	keys := s.Keys()
	env.Client.Set(ctx, keys.Lock("held"), "node-a|3", 30*time.Second)
	env.Client.Set(ctx, keys.Lock("parked"), "node-b|4|p", 0)
	got, err := s.LockHolders(ctx, []string{"held", "none", "parked"})
	if err != nil || len(got) != 3 || got[0] != "node-a|3" || got[1] != "" || got[2] != "node-b|4|p" {
		t.Fatalf("lock holders %q, %v", got, err)
	}
	if got, err := s.LockHolders(ctx, nil); err != nil || len(got) != 0 {
		t.Fatalf("no jobs: %q, %v", got, err)
	}
	if d, err := s.LockRemaining(ctx, "held"); err != nil || d <= 25*time.Second || d > 30*time.Second {
		t.Fatalf("held: %v, %v; want about 30 s", d, err)
	}
	if d, err := s.LockRemaining(ctx, "parked"); err != nil || d != 0 {
		t.Fatalf("parked, node-b's lease lapsed: %v, %v; want 0", d, err)
	}
	env.Client.Set(ctx, keys.Alive(store.Shard("parked"), "node-b"), "1", 20*time.Second)
	if d, err := s.LockRemaining(ctx, "parked"); err != nil || d <= 15*time.Second || d > 20*time.Second {
		t.Fatalf("parked, node-b's lease held: %v, %v; want about 20 s", d, err)
	}
	env.Client.Set(ctx, keys.Lock("odd"), "node-c|5", 0)
	if d, err := s.LockRemaining(ctx, "odd"); err != nil || d != -1 {
		t.Fatalf("a lock with no TTL, not parked: %v, %v; want -1", d, err)
	}
	if d, err := s.LockRemaining(ctx, "none"); err != nil || d != 0 {
		t.Fatalf("none: %v, %v; want 0", d, err)
	}
}

// OwnerWait: an event whose owner did not answer waits, while the owner's
// node lease is fresh (the owner may only be cut off from NATS), until the
// lease would go stale; once it is stale or missing, its lock's remaining
// TTL.
func TestOwnerWaitTellsACutOffOwnerFromADeadOne(t *testing.T) {
	env := testenv.New(t)
	s := store.New(env.Client, store.Config{Prefix: env.KeyPrefix(), LockTTL: 30 * time.Second})
	ctx := context.Background()
	keys := s.Keys()
	env.Client.Set(ctx, keys.Lock("j"), "owner|3", 30*time.Second)
	if d, err := s.OwnerWait(ctx, "j"); err != nil || d <= 25*time.Second || d > 30*time.Second {
		t.Fatalf("owner with no lease entry: %v, %v; want the lock's ~30 s", d, err)
	}
	env.Client.ZAdd(ctx, keys.Nodes(), redis.Z{Score: float64(time.Now().UnixMilli()), Member: "owner"})
	if d, err := s.OwnerWait(ctx, "j"); err != nil || d <= 11*time.Second || d > 12*time.Second {
		t.Fatalf("owner renewed its lease just now: %v, %v; want ~12 s (LockTTL/3 + 2 s)", d, err)
	}
	stale := time.Now().Add(-30*time.Second/3 - 3*time.Second)
	env.Client.ZAdd(ctx, keys.Nodes(), redis.Z{Score: float64(stale.UnixMilli()), Member: "owner"})
	if d, err := s.OwnerWait(ctx, "j"); err != nil || d <= 25*time.Second || d > 30*time.Second {
		t.Fatalf("owner's lease a renewal period and more old: %v, %v; want the lock's ~30 s", d, err)
	}
	if d, err := s.OwnerWait(ctx, "no-lock"); err != nil || d != 0 {
		t.Fatalf("no lock: %v, %v; want 0", d, err)
	}
}
