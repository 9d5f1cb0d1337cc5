package store

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestHashListpackValueReadsTheClusterMasters: through a Redis Cluster
// client the store reads hash-max-listpack-value from the masters (a
// one-master cluster here), not from whichever node a command lands on.
func TestHashListpackValueReadsTheClusterMasters(t *testing.T) {
	t.Parallel()
	addr := startOneMasterCluster(t)
	ctx := context.Background()
	plain := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = plain.Close() })
	if err := plain.ConfigSet(ctx, "hash-max-listpack-value", "256").Err(); err != nil {
		t.Fatal(err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}})
	t.Cleanup(func() { _ = cc.Close() })
	if v, ok := New(cc, Config{Prefix: "enccluster:"}).HashListpackValue(ctx); !ok || v != 256 {
		t.Fatalf("cluster: %d, %v; want 256, true", v, ok)
	}
}
