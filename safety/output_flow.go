package safety

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ResultStore reads the content behind result pointers and stores redacted
// copies.
type ResultStore interface {
	// Fetch returns the content ptr points at. It may return at most a few
	// bytes more than the checker scans (a size check needs to see that
	// the content is too large, not all of it).
	Fetch(ctx context.Context, ptr string) ([]byte, error)
	// StoreRedacted stores a redacted copy of the content at ptr and
	// returns the copy's pointer.
	StoreRedacted(ctx context.Context, jobID, ptr string, content []byte) (string, error)
}

// errUnsupportedPointer: a result pointer this store cannot read.
var errUnsupportedPointer = errors.New("safety: unsupported result pointer")

// ErrNoResult: the pointer's key does not exist (expired, never written).
var ErrNoResult = errors.New("safety: no result behind the pointer")

// RedisResultStore reads CAP's Redis result pointers ("redis://<key>", the
// key as the worker wrote it, e.g. res:<job_id>) and stores redacted copies
// beside them ("<key>:redacted", with the original's TTL).
type RedisResultStore struct {
	Client redis.UniversalClient
	// MaxBytes is the most Fetch reads (default
	// outputMaxResultBytesDefault); it reads one byte more, so that the
	// checker's size limit sees an oversize result as oversize.
	MaxBytes int64
	// RedactedTTL applies to a redacted copy when the original has no TTL
	// (0: none).
	RedactedTTL time.Duration
}

// redisPointerPrefix starts every Redis result pointer.
const redisPointerPrefix = "redis://"

func redisKey(ptr string) (string, error) {
	key, ok := strings.CutPrefix(ptr, redisPointerPrefix)
	if !ok || key == "" {
		return "", fmt.Errorf("%w: %q", errUnsupportedPointer, ptr)
	}
	return key, nil
}

// Fetch reads the value behind a redis:// pointer.
func (s *RedisResultStore) Fetch(ctx context.Context, ptr string) ([]byte, error) {
	key, err := redisKey(ptr)
	if err != nil {
		return nil, err
	}
	max := s.MaxBytes
	if max <= 0 {
		max = outputMaxResultBytesDefault
	}
	// GETRANGE reads at most max+1 bytes of a value of any size; EXISTS
	// tells a missing key from an empty value.
	var ex *redis.IntCmd
	var get *redis.StringCmd
	_, err = s.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		ex = p.Exists(ctx, key)
		get = p.GetRange(ctx, key, 0, max)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("safety: fetch %s: %w", ptr, err)
	}
	if ex.Val() == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoResult, ptr)
	}
	return []byte(get.Val()), nil
}

// StoreRedacted writes content under "<key>:redacted".
func (s *RedisResultStore) StoreRedacted(ctx context.Context, _, ptr string, content []byte) (string, error) {
	key, err := redisKey(ptr)
	if err != nil {
		return "", err
	}
	ttl := s.RedactedTTL
	if d, err := s.Client.PTTL(ctx, key).Result(); err == nil && d > 0 {
		ttl = d
	}
	rkey := key + ":redacted"
	if err := s.Client.Set(ctx, rkey, content, ttl).Err(); err != nil {
		return "", fmt.Errorf("safety: store redacted copy of %s: %w", ptr, err)
	}
	return redisPointerPrefix + rkey, nil
}
