package store

import (
	"context"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// A job record stays in Redis's compact listpack encoding only while every
// value in it is at most hash-max-listpack-value bytes (64 by default). A
// real job's encoded request ("req") is longer, and so is the packed field
// (fieldPacked: topic, tenant, trace and the policy decision), so with the
// default every record becomes a hashtable at its create. A compact record
// measured ~1.3 KB less Redis memory and a ~3× cheaper HGETALL, at about
// the same CPU per job (BENCHMARKS.md, "the job record's hash encoding");
// the node says so at start when the server's setting is below
// ListpackValueAdvised.

// ListpackValueAdvised is the hash-max-listpack-value the node advises: it
// keeps a record whose request encodes to at most 1 KB compact. Larger
// requests leave it, as with the default.
const ListpackValueAdvised = 1024

// HashListpackValue returns the smallest hash-max-listpack-value (Redis 7;
// hash-max-ziplist-value before it) among the servers the store writes to:
// every master of a Redis Cluster. ok is false when a server refuses CONFIG
// GET (a managed Redis may) or names neither setting: then nothing is known.
func (s *Store) HashListpackValue(ctx context.Context) (v int, ok bool) {
	if cc, isCluster := s.rdb.(*redis.ClusterClient); isCluster {
		v, ok = -1, true
		var mu sync.Mutex // ForEachMaster calls fn for the masters concurrently
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mv, mok := listpackValue(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			if !mok {
				ok = false
			} else if v < 0 || mv < v {
				v = mv
			}
			return nil
		})
		if err != nil || !ok || v < 0 {
			return 0, false
		}
		return v, true
	}
	return listpackValue(ctx, s.rdb)
}

func listpackValue(ctx context.Context, c redis.Cmdable) (int, bool) {
	for _, name := range []string{"hash-max-listpack-value", "hash-max-ziplist-value"} {
		m, err := c.ConfigGet(ctx, name).Result()
		if err != nil {
			return 0, false
		}
		if s, found := m[name]; found {
			n, err := strconv.Atoi(s)
			return n, err == nil
		}
	}
	return 0, false
}
