package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Key names, after the caller's prefix. The hash tag keeps the lock and the
// snapshot in one Redis Cluster slot, so the fenced write can touch both.
const (
	snapshotKeySuffix     = "{registry}:snapshot"
	snapshotLockKeySuffix = "{registry}:snapshot:lock"
)

// ErrNoSnapshot means no snapshot is stored (first start, or every replica
// was down for longer than the snapshot TTL).
var ErrNoSnapshot = errors.New("no registry snapshot stored")

// acquireScript takes the writer lock for ARGV[1] or renews it if ARGV[1]
// already holds it (SET NX PX, plus renewal in the same round trip).
var acquireScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
`)

// writeScript stores the snapshot only while ARGV[1] holds the lock, so a
// writer that stalled past its lock cannot overwrite its successor's copy.
var writeScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
`)

// releaseScript drops the lock only if ARGV[1] holds it.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// SnapshotStore keeps the registry snapshot and its single-writer lock in
// Redis. It is safe for concurrent use.
type SnapshotStore struct {
	rdb     redis.UniversalClient
	key     string
	lockKey string
}

// NewSnapshotStore returns a store whose keys start with prefix.
func NewSnapshotStore(rdb redis.UniversalClient, prefix string) *SnapshotStore {
	return &SnapshotStore{rdb: rdb, key: prefix + snapshotKeySuffix, lockKey: prefix + snapshotLockKeySuffix}
}

// Acquire takes or renews the writer lock for owner for ttl and reports
// whether owner holds it.
func (s *SnapshotStore) Acquire(ctx context.Context, owner string, ttl time.Duration) (bool, error) {
	n, err := acquireScript.Run(ctx, s.rdb, []string{s.lockKey}, owner, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("registry: snapshot lock: %w", err)
	}
	return n == 1, nil
}

// Write stores data (kept for ttl) if owner holds the lock, and reports
// whether it did.
func (s *SnapshotStore) Write(ctx context.Context, owner string, data []byte, ttl time.Duration) (bool, error) {
	n, err := writeScript.Run(ctx, s.rdb, []string{s.lockKey, s.key}, owner, data, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("registry: write snapshot: %w", err)
	}
	return n == 1, nil
}

// Release drops the lock if owner holds it, so another replica can take
// over at its next tick instead of after the lock TTL.
func (s *SnapshotStore) Release(ctx context.Context, owner string) error {
	if err := releaseScript.Run(ctx, s.rdb, []string{s.lockKey}, owner).Err(); err != nil {
		return fmt.Errorf("registry: release snapshot lock: %w", err)
	}
	return nil
}

// Read returns the stored snapshot bytes, or ErrNoSnapshot.
func (s *SnapshotStore) Read(ctx context.Context) ([]byte, error) {
	data, err := s.rdb.Get(ctx, s.key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, ErrNoSnapshot
	}
	if err != nil {
		return nil, fmt.Errorf("registry: read snapshot: %w", err)
	}
	return data, nil
}

// Load reads and decodes the stored snapshot.
func (s *SnapshotStore) Load(ctx context.Context) (*Snapshot, error) {
	data, err := s.Read(ctx)
	if err != nil {
		return nil, err
	}
	return DecodeSnapshot(data)
}
