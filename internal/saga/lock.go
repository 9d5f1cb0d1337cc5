package saga

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/store"
)

// Workflow and poller locks are owner-checked leases (store.TakeLease and
// friends): a holder only ever extends or deletes a lock whose value is
// still its own token, so a holder that stalled past its TTL cannot extend
// or free the lock a successor took meanwhile.

var (
	// dropTriggerScript removes a workflow from one shard's trigger set
	// only if it was triggered no later than ARGV[2] (unix ms): a step that
	// failed fatally while the rollback ran triggers it again, and that
	// trigger must survive so the poller starts another round.
	dropTriggerScript = redis.NewScript(`
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) <= tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0`)
)

// lockToken is a lock value unique to one holding: the node id (so an
// operator sees who holds it) and a random suffix (so two runners of one
// node, or a restarted actor, never mistake each other's lock for theirs).
func lockToken(nodeID string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return nodeID + "|" + hex.EncodeToString(b[:])
}

// takeLock sets key to token for ttl if nobody holds it, or extends it if
// token already holds it.
func takeLock(ctx context.Context, rdb redis.UniversalClient, key, token string, ttl time.Duration) (bool, error) {
	return store.TakeLease(ctx, rdb, key, token, ttl)
}

func renewLock(ctx context.Context, rdb redis.UniversalClient, key, token string, ttl time.Duration) (bool, error) {
	return store.RenewLease(ctx, rdb, key, token, ttl)
}

func releaseLock(rdb redis.UniversalClient, key, token string) {
	// A fresh context: release runs when the work's context is already
	// cancelled, and a lock left behind only costs its TTL.
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_, _ = store.ReleaseLease(ctx, rdb, key, token)
}
