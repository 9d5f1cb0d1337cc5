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

// takeLeaseScript (lua/take_lease.lua) takes a free lease or extends the
// owner's own; renewLeaseScript (lua/renew_lease.lua) extends it and
// releaseLeaseScript (lua/release_lease.lua) deletes it, each only if the
// owner holds it.
var (
	takeLeaseScript    = luaScript("take_lease")
	renewLeaseScript   = luaScript("renew_lease")
	releaseLeaseScript = luaScript("release_lease")
)

// leaseCall is a call of one of the lease scripts. ttl is not sent to
// releaseLeaseScript, which takes none.
type leaseCall struct {
	sc       *redis.Script
	leaseKey string
	owner    string
	ttl      time.Duration
}

func (c leaseCall) script() *redis.Script { return c.sc }
func (c leaseCall) keys() []string        { return []string{c.leaseKey} }
func (c leaseCall) args() []interface{} {
	if c.sc == releaseLeaseScript {
		return []interface{}{c.owner}
	}
	return []interface{}{c.owner, c.ttl.Milliseconds()}
}

// TakeLease makes owner the holder of the lease key for ttl if nobody holds
// it, or extends it if owner holds it already, and reports whether owner
// holds it.
func TakeLease(ctx context.Context, rdb redis.Scripter, key, owner string, ttl time.Duration) (bool, error) {
	n, err := runScript(ctx, rdb, leaseCall{sc: takeLeaseScript, leaseKey: key, owner: owner, ttl: ttl}).Int()
	if err != nil {
		return false, fmt.Errorf("store: take lease %s: %w", key, err)
	}
	return n == 1, nil
}

// RenewLease extends the lease key to ttl if owner holds it, and reports
// whether it did.
func RenewLease(ctx context.Context, rdb redis.Scripter, key, owner string, ttl time.Duration) (bool, error) {
	n, err := runScript(ctx, rdb, leaseCall{sc: renewLeaseScript, leaseKey: key, owner: owner, ttl: ttl}).Int()
	if err != nil {
		return false, fmt.Errorf("store: renew lease %s: %w", key, err)
	}
	return n == 1, nil
}

// ReleaseLease deletes the lease key if owner holds it, and reports whether
// it did.
func ReleaseLease(ctx context.Context, rdb redis.Scripter, key, owner string) (bool, error) {
	n, err := runScript(ctx, rdb, leaseCall{sc: releaseLeaseScript, leaseKey: key, owner: owner}).Int()
	if err != nil {
		return false, fmt.Errorf("store: release lease %s: %w", key, err)
	}
	return n == 1, nil
}
