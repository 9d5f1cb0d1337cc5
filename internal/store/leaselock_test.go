package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/store"
)

func TestLeaseIsOwnerChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, rdb := context.Background(), b.s.Client()
	key := b.s.Keys().Prefix() + "lock:test"
	if ok, err := store.TakeLease(ctx, rdb, key, "a", time.Minute); err != nil || !ok {
		t.Fatalf("a takes a free lease: %v %v", ok, err)
	}
	if ok, _ := store.TakeLease(ctx, rdb, key, "b", time.Minute); ok {
		t.Fatal("b took a's lease")
	}
	rdb.PExpire(ctx, key, 10*time.Second)
	if ok, _ := store.TakeLease(ctx, rdb, key, "a", time.Minute); !ok || rdb.PTTL(ctx, key).Val() < 30*time.Second {
		t.Fatal("a's take did not extend its own lease")
	}
	if ok, _ := store.RenewLease(ctx, rdb, key, "b", time.Hour); ok || rdb.PTTL(ctx, key).Val() > time.Minute {
		t.Fatal("b extended a's lease")
	}
	if ok, _ := store.ReleaseLease(ctx, rdb, key, "b"); ok || rdb.Get(ctx, key).Val() != "a" {
		t.Fatal("b released a's lease")
	}
	if ok, _ := store.RenewLease(ctx, rdb, key, "a", time.Hour); !ok || rdb.PTTL(ctx, key).Val() < 50*time.Minute {
		t.Fatal("a could not renew its lease")
	}
	if ok, _ := store.ReleaseLease(ctx, rdb, key, "a"); !ok || rdb.Exists(ctx, key).Val() != 0 {
		t.Fatal("a could not release its lease")
	}
	if ok, _ := store.RenewLease(ctx, rdb, key, "a", time.Hour); ok {
		t.Fatal("a renewed a lease nobody holds")
	}
}
