package store

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Redis Cluster support. Every script and MULTI of this package touches one
// hash slot (see Keys); what remains is the few commands whose meaning
// depends on the node they reach. SCAN walks the keyspace of one node only,
// so on a cluster client a scan has to visit every master.

// masterWalker is what a cluster client offers to reach each master
// (redis.ClusterClient); a plain client or a failover client has one
// keyspace and does not need it.
type masterWalker interface {
	ForEachMaster(ctx context.Context, fn func(ctx context.Context, client *redis.Client) error) error
}

// ScanKeys calls fn with every key matching pattern, over every master of a
// Redis Cluster or the one keyspace of any other client. fn may be called
// from several goroutines at once (one per master). A key may be reported
// twice (SCAN's guarantee) and keys written during the scan may be missed.
func ScanKeys(ctx context.Context, rdb redis.UniversalClient, pattern string, fn func(key string) error) error {
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 500).Iterator()
		for iter.Next(ctx) {
			if err := fn(iter.Val()); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	if w, ok := rdb.(masterWalker); ok {
		return w.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	}
	return scan(ctx, rdb)
}

// DeleteKeys deletes keys one slot at a time: a multi-key DEL whose keys
// hash to different slots is refused by a cluster (CROSSSLOT). It pipelines
// one DEL per key, which any client routes, and returns the first error.
func DeleteKeys(ctx context.Context, rdb redis.UniversalClient, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	pipe := rdb.Pipeline()
	for _, k := range keys {
		pipe.Del(ctx, k)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// keyCollector gathers keys reported by ScanKeys from several goroutines.
type keyCollector struct {
	mu   sync.Mutex
	keys []string
}

func (c *keyCollector) add(k string) error {
	c.mu.Lock()
	c.keys = append(c.keys, k)
	c.mu.Unlock()
	return nil
}
