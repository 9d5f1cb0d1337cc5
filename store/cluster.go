package store

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Redis Cluster support. Every script and MULTI of this package touches one
// hash slot (see Keys); nothing scans the keyspace (a SCAN would see one
// master's keys only): what must be found again is listed in a set.

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
