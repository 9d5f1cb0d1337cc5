package router

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Key names, after the caller's prefix. The hash tag keeps both keys in one
// Redis Cluster slot so a change and its version bump are one transaction.
const (
	mappingsKeySuffix = "{routing}:topics"  // hash: topic → "pool1,pool2"
	versionKeySuffix  = "{routing}:version" // counter: bumped on every change
	pausedKeySuffix   = "{routing}:paused"  // set: paused topics (pause.go)
)

// ErrInvalidMapping is returned for a mapping the store refuses to keep.
var ErrInvalidMapping = errors.New("invalid topic mapping")

// Mappings is the runtime topic → pools set at one version.
type Mappings struct {
	Version int64
	Topics  map[string][]string
	// Paused are the topics paused at run time (pause.go).
	Paused map[string]bool
}

// MappingStore keeps topic → pool mappings added at runtime (CLI/API) in
// Redis, where every replica reads them. A change bumps a version counter;
// replicas poll the counter (PoolsWatcher) and reload on a new value, which
// unlike pub/sub cannot miss a change made while a replica was disconnected.
// It is safe for concurrent use.
type MappingStore struct {
	rdb        redis.UniversalClient
	key        string
	versionKey string
	pausedKey  string
}

// NewMappingStore returns a store whose keys start with prefix.
func NewMappingStore(rdb redis.UniversalClient, prefix string) *MappingStore {
	return &MappingStore{rdb: rdb, key: prefix + mappingsKeySuffix, versionKey: prefix + versionKeySuffix,
		pausedKey: prefix + pausedKeySuffix}
}

// Set maps topic to pools, replacing any runtime mapping of the topic (a
// runtime mapping also replaces the file's mapping of the topic).
func (s *MappingStore) Set(ctx context.Context, topic string, pools ...string) error {
	if err := validMapping(topic, pools); err != nil {
		return err
	}
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, s.key, topic, strings.Join(pools, ","))
		p.Incr(ctx, s.versionKey)
		return nil
	})
	if err != nil {
		return fmt.Errorf("router: set mapping %s: %w", topic, err)
	}
	return nil
}

// Delete drops the runtime mapping of topic; the file's mapping, if any,
// applies again.
func (s *MappingStore) Delete(ctx context.Context, topic string) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HDel(ctx, s.key, topic)
		p.Incr(ctx, s.versionKey)
		return nil
	})
	if err != nil {
		return fmt.Errorf("router: delete mapping %s: %w", topic, err)
	}
	return nil
}

// Version returns the current version (0 before the first change).
func (s *MappingStore) Version(ctx context.Context) (int64, error) {
	v, err := s.rdb.Get(ctx, s.versionKey).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("router: mapping version: %w", err)
	}
	return v, nil
}

// Load reads every runtime mapping together with the version it belongs to.
// A stored value that does not parse is skipped: one bad entry written by
// hand must not hide the others.
func (s *MappingStore) Load(ctx context.Context) (Mappings, error) {
	var (
		ver    *redis.StringCmd
		all    *redis.MapStringStringCmd
		paused *redis.StringSliceCmd
	)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		ver = p.Get(ctx, s.versionKey)
		all = p.HGetAll(ctx, s.key)
		paused = p.SMembers(ctx, s.pausedKey)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Mappings{}, fmt.Errorf("router: load mappings: %w", err)
	}
	m := Mappings{Topics: map[string][]string{}, Paused: map[string]bool{}}
	for _, t := range paused.Val() {
		m.Paused[t] = true
	}
	if v, err := ver.Result(); err == nil {
		m.Version, _ = strconv.ParseInt(v, 10, 64)
	}
	for topic, joined := range all.Val() {
		pools := strings.Split(joined, ",")
		if validMapping(topic, pools) == nil {
			m.Topics[topic] = pools
		}
	}
	return m, nil
}

func validMapping(topic string, pools []string) error {
	if topic == "" || strings.ContainsAny(topic, " \t\r\n") {
		return fmt.Errorf("%w: topic %q", ErrInvalidMapping, topic)
	}
	if len(pools) == 0 {
		return fmt.Errorf("%w: topic %s needs at least one pool", ErrInvalidMapping, topic)
	}
	for _, p := range pools {
		// The comma separates pools in the stored value.
		if p == "" || strings.ContainsAny(p, ", \t\r\n") {
			return fmt.Errorf("%w: topic %s: pool name %q", ErrInvalidMapping, topic, p)
		}
	}
	return nil
}
