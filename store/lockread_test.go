package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/store"
)

// TestLockReads: LockHolders reads each job's lock in order ("" for none);
// LockRemaining says how long a lock has left: its TTL, -1 for a lock with
// none (parked), 0 for no lock — against a real Redis.
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
	if d, err := s.LockRemaining(ctx, "parked"); err != nil || d != -1 {
		t.Fatalf("parked: %v, %v; want -1", d, err)
	}
	if d, err := s.LockRemaining(ctx, "none"); err != nil || d != 0 {
		t.Fatalf("none: %v, %v; want 0", d, err)
	}
}
