package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Owner-checked leases on one key: a leader lock (the due poller's, the saga
// poller's) or a per-item lock (a saga rollback's). The value is the
// owner's token; every change is a script that compares it first, so an
// owner that stalled past its TTL — its lease lapsed and another owner took
// the key — can neither extend nor delete the successor's lease. (A GET
// followed by a PEXPIRE or a DEL is not enough: the lease may change hands
// between the two.) Each script touches its one key, so it runs anywhere in
// a Redis Cluster.

var (
	// takeLeaseScript: KEYS: lease. ARGV: owner, ttl_ms. Returns 1 if the
	// owner holds the lease now (it was free, or already the owner's: then
	// extended), 0 if another owner holds it.
	takeLeaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0`)
	// renewLeaseScript: compare and PEXPIRE. KEYS: lease. ARGV: owner,
	// ttl_ms. Returns 1 if extended.
	renewLeaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)
	// releaseLeaseScript: compare and DEL. KEYS: lease. ARGV: owner.
	// Returns 1 if deleted.
	releaseLeaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)
)

// TakeLease makes owner the holder of the lease key for ttl if nobody holds
// it, or extends it if owner holds it already, and reports whether owner
// holds it.
func TakeLease(ctx context.Context, rdb redis.Scripter, key, owner string, ttl time.Duration) (bool, error) {
	n, err := takeLeaseScript.Run(ctx, rdb, []string{key}, owner, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("store: take lease %s: %w", key, err)
	}
	return n == 1, nil
}

// RenewLease extends the lease key to ttl if owner holds it, and reports
// whether it did.
func RenewLease(ctx context.Context, rdb redis.Scripter, key, owner string, ttl time.Duration) (bool, error) {
	n, err := renewLeaseScript.Run(ctx, rdb, []string{key}, owner, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("store: renew lease %s: %w", key, err)
	}
	return n == 1, nil
}

// ReleaseLease deletes the lease key if owner holds it, and reports whether
// it did.
func ReleaseLease(ctx context.Context, rdb redis.Scripter, key, owner string) (bool, error) {
	n, err := releaseLeaseScript.Run(ctx, rdb, []string{key}, owner).Int()
	if err != nil {
		return false, fmt.Errorf("store: release lease %s: %w", key, err)
	}
	return n == 1, nil
}
