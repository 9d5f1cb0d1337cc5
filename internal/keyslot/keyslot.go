// Package keyslot keeps concurrency-key slots in Redis, shared by every
// replica: per key, a sorted set of the jobs holding one of its slots
// (member the job, score when the slot was taken; a slot lingering after
// its job ended with its worker maybe still running it is a member of its
// own, the job and the time it lingers until, scored minus that time, so a
// later run of the same job never takes it over) and a sorted set of the jobs waiting for one (score: when the wait
// began). Both carry the key's own hash tag, so each script touches one
// Redis Cluster slot. A freed slot is announced on one pub/sub channel
// (Wakes). A release that knows the key's limit hands the freed slot on:
// the script moves the key's oldest waiter into its holders and names it
// in the notice ("key\njob"), and the node with that job wakes it, which
// finds the slot already its own (no race between the nodes' waiters).
// A notice naming no job (no limit given, or an older node's) makes every
// node wake its oldest local waiter of that key, who asks again. Nothing
// polls Redis per waiting job.
package keyslot

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// MaxKeyLen bounds a concurrency key's length in bytes.
const MaxKeyLen = 128

// Strategy is what a job does when its key has no free slot.
type Strategy string

const (
	// Queue: the job waits for a slot (the default).
	Queue Strategy = "queue"
	// CancelNewest: the job is cancelled.
	CancelNewest Strategy = "cancel_newest"
	// CancelInProgress: the oldest holder is cancelled and the job waits
	// for its slot, first in line.
	CancelInProgress Strategy = "cancel_in_progress"
)

// ParseStrategy reads a strategy name ("" is Queue).
func ParseStrategy(s string) (Strategy, error) {
	switch Strategy(strings.ToLower(strings.TrimSpace(s))) {
	case "", Queue:
		return Queue, nil
	case CancelNewest:
		return CancelNewest, nil
	case CancelInProgress:
		return CancelInProgress, nil
	}
	return "", fmt.Errorf("keyslot: unknown strategy %q (queue, cancel_newest or cancel_in_progress)", s)
}

// CheckKey reports whether key is usable: non-empty, at most MaxKeyLen
// bytes, printable with no braces (the hash tag's delimiters).
func CheckKey(key string) error {
	if key == "" {
		return errors.New("keyslot: empty concurrency key")
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("keyslot: concurrency key of %d bytes (at most %d)", len(key), MaxKeyLen)
	}
	for _, r := range key {
		if r < 0x20 || r == 0x7f || r == '{' || r == '}' {
			return fmt.Errorf("keyslot: concurrency key %q has a control character or a brace", key)
		}
	}
	return nil
}

// Outcome is what Acquire found.
type Outcome int

const (
	// Admitted: the job holds a slot (it did already, or one was free).
	Admitted Outcome = iota + 1
	// Waiting: no slot; the job is in the key's waiting set.
	Waiting
	// Refused: no slot, strategy CancelNewest; the job is not waiting.
	Refused
)

// Result is Acquire's answer.
type Result struct {
	Outcome Outcome
	// Holders is the key's holders after the call; Waiters its waiting jobs.
	Holders, Waiters int
	// Victim: with CancelInProgress and no slot, the oldest holder not
	// already lingering, to cancel ("" if none).
	Victim string
}

// Slots is the key slots of one Redis under one key prefix.
type Slots struct {
	rdb    redis.UniversalClient
	prefix string
}

// New returns the key slots kept under prefix in rdb.
func New(rdb redis.UniversalClient, prefix string) *Slots {
	return &Slots{rdb: rdb, prefix: prefix}
}

// Holders, Waiters name a key's sets; Keys the set of every key used;
// Wakes the channel freed slots are announced on.
func (s *Slots) Holders(key string) string { return s.prefix + "{ck:" + key + "}:h" }
func (s *Slots) Waiters(key string) string { return s.prefix + "{ck:" + key + "}:w" }
func (s *Slots) Keys() string              { return s.prefix + "ckeys" }
func (s *Slots) Wakes() string             { return s.prefix + "ckey:wake" }

// lingerMember names the slot a run of job keeps counted until till_ms
// after the job ended: apart from the job's own member, so a later run of
// the job (its record re-created) takes a slot of its own.
func lingerMember(job string, tillMs int64) string {
	return job + "\x00" + strconv.FormatInt(tillMs, 10)
}

// acquireScript: KEYS holders, waiters; ARGV job, limit, strategy, now_ms.
// Lingering holders (negative score) whose time has passed are dropped
// first; a lingering slot still under the job's own member (written by an
// older release) is moved to a member of its own, still counted. Returns
// {outcome, holders, waiters, victim}.
var acquireScript = redis.NewScript(`
local h, w = KEYS[1], KEYS[2]
local job, limit, strategy, now = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', h, -now, '(0')
local held = redis.call('ZSCORE', h, job)
if held and tonumber(held) > 0 then
  redis.call('ZADD', h, now, job)
  return {1, redis.call('ZCARD', h), redis.call('ZCARD', w), ''}
end
if held then
  redis.call('ZREM', h, job)
  redis.call('ZADD', h, held, job .. '\0' .. string.format('%d', -tonumber(held)))
end
if redis.call('ZCARD', h) < limit then
  redis.call('ZADD', h, now, job)
  redis.call('ZREM', w, job)
  return {1, redis.call('ZCARD', h), redis.call('ZCARD', w), ''}
end
if strategy == 'cancel_newest' then
  return {3, redis.call('ZCARD', h), redis.call('ZCARD', w), ''}
end
local victim = ''
if strategy == 'cancel_in_progress' then
  local oldest = redis.call('ZRANGEBYSCORE', h, '(0', '+inf', 'LIMIT', 0, 1)
  if oldest[1] then victim = oldest[1] end
  redis.call('ZADD', w, 0, job)
else
  redis.call('ZADD', w, 'NX', now, job)
end
return {2, redis.call('ZCARD', h), redis.call('ZCARD', w), victim}
`)

// releaseScript: KEYS holders, waiters; ARGV job, linger_until_ms (0: free
// now), channel, key, linger member, limit (0: unknown), now_ms. Removes
// job from the waiters; frees its slot or moves it to the linger member,
// counted until then. A lingering slot is never freed early: it lapses.
// A freed slot with a limit given is handed on: lapsed lingering slots are
// dropped, then while the key has fewer holders than limit its oldest
// waiter (lowest score: cancel_in_progress's 0 first, then by when it
// began waiting) is moved into the holders and named on the channel
// ("key\njob"); without a limit the key alone is announced if it has
// waiters. Returns 1 if a slot was freed.
var releaseScript = redis.NewScript(`
local h, w = KEYS[1], KEYS[2]
local job, till = ARGV[1], tonumber(ARGV[2])
local limit, now = tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREM', w, job)
local held = redis.call('ZSCORE', h, job)
if not held or tonumber(held) < 0 then return 0 end
if till > 0 then
  redis.call('ZREM', h, job)
  redis.call('ZADD', h, -till, ARGV[5])
  return 0
end
redis.call('ZREM', h, job)
if limit <= 0 then
  if redis.call('ZCARD', w) > 0 then redis.call('PUBLISH', ARGV[3], ARGV[4]) end
  return 1
end
redis.call('ZREMRANGEBYSCORE', h, -now, '(0')
for _ = 1, 1000 do
  if redis.call('ZCARD', h) >= limit then break end
  local first = redis.call('ZRANGE', w, 0, 0, 'WITHSCORES')
  local next = first[1]
  if not next then break end
  redis.call('ZREM', w, next)
  local had = redis.call('ZSCORE', h, next)
  if had and tonumber(had) < 0 then
    redis.call('ZREM', h, next)
    redis.call('ZADD', h, had, next .. '\0' .. string.format('%d', -tonumber(had)))
    had = false
  end
  if not had and redis.call('ZCARD', h) < limit then
    redis.call('ZADD', h, now, next)
    redis.call('PUBLISH', ARGV[3], ARGV[4] .. '\n' .. next)
  elseif not had then
    redis.call('ZADD', w, first[2], next)
    break
  end
end
return 1
`)

// Acquire takes one of limit slots of key for job, or (by strategy)
// queues it or refuses it.
func (s *Slots) Acquire(ctx context.Context, key, job string, limit int, strategy Strategy, now time.Time) (Result, error) {
	if err := CheckKey(key); err != nil {
		return Result{}, err
	}
	if strategy == "" {
		strategy = Queue
	}
	pipe := s.rdb.Pipeline()
	pipe.SAdd(ctx, s.Keys(), key)
	cmd := acquireScript.Run(ctx, pipe, []string{s.Holders(key), s.Waiters(key)}, job, limit, string(strategy), now.UnixMilli())
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		if !isNoScript(err) {
			return Result{}, fmt.Errorf("keyslot: acquire %s: %w", key, err)
		}
		// A pipelined EVALSHA is not retried as EVAL: load it and go again.
		if err := acquireScript.Load(ctx, s.rdb).Err(); err != nil {
			return Result{}, fmt.Errorf("keyslot: acquire %s: %w", key, err)
		}
		cmd = acquireScript.Run(ctx, s.rdb, []string{s.Holders(key), s.Waiters(key)}, job, limit, string(strategy), now.UnixMilli())
	}
	v, err := cmd.Slice()
	if err != nil {
		return Result{}, fmt.Errorf("keyslot: acquire %s: %w", key, err)
	}
	if len(v) != 4 {
		return Result{}, fmt.Errorf("keyslot: acquire %s: %d values", key, len(v))
	}
	o, _ := v[0].(int64)
	h, _ := v[1].(int64)
	w, _ := v[2].(int64)
	victim, _ := v[3].(string)
	return Result{Outcome: Outcome(o), Holders: int(h), Waiters: int(w), Victim: victim}, nil
}

func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// Release gives job's slot of key back and takes it off the key's waiters;
// with lingerUntil set, the slot stays counted until then (its worker may
// still be running the job). With limit > 0 (the key's limit) a freed slot
// is handed to the key's oldest waiter, named in the notice (see
// releaseScript); with 0 the key's waiters are only told. Freed reports
// whether a slot was freed.
func (s *Slots) Release(ctx context.Context, key, job string, lingerUntil time.Time, limit int) (freed bool, err error) {
	if CheckKey(key) != nil {
		return false, nil // never taken
	}
	var until int64
	if !lingerUntil.IsZero() {
		until = lingerUntil.UnixMilli()
	}
	n, err := releaseScript.Run(ctx, s.rdb, []string{s.Holders(key), s.Waiters(key)}, job, until, s.Wakes(), key,
		lingerMember(job, until), max(limit, 0), time.Now().UnixMilli()).Int()
	if err != nil {
		return false, fmt.Errorf("keyslot: release %s: %w", key, err)
	}
	return n == 1, nil
}

// Stat is one key's state; Limit and Strategy are the pools file's (0
// and "": no limit), filled by the node, not read from Redis.
type Stat struct {
	Key       string `json:"key"`
	Limit     int    `json:"limit"`
	Strategy  string `json:"strategy,omitempty"`
	Holders   int    `json:"holders"`
	Lingering int    `json:"lingering"`
	Waiters   int    `json:"waiters"`
}

// Stats returns the state of every key used (at most max keys).
func (s *Slots) Stats(ctx context.Context, max int) ([]Stat, error) {
	keys, err := s.allKeys(ctx, max)
	if err != nil {
		return nil, err
	}
	pipe := s.rdb.Pipeline()
	type cmds struct{ h, l, w *redis.IntCmd }
	cs := make([]cmds, len(keys))
	for i, k := range keys {
		cs[i] = cmds{pipe.ZCard(ctx, s.Holders(k)), pipe.ZCount(ctx, s.Holders(k), "-inf", "(0"), pipe.ZCard(ctx, s.Waiters(k))}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("keyslot: stats: %w", err)
	}
	out := make([]Stat, 0, len(keys))
	for i, k := range keys {
		out = append(out, Stat{Key: k, Holders: int(cs[i].h.Val()), Lingering: int(cs[i].l.Val()), Waiters: int(cs[i].w.Val())})
	}
	return out, nil
}

func (s *Slots) allKeys(ctx context.Context, max int) ([]string, error) {
	seen := map[string]bool{}
	var keys []string
	var cursor uint64
	for range 10000 {
		batch, next, err := s.rdb.SScan(ctx, s.Keys(), cursor, "", 1000).Result()
		if err != nil {
			return nil, fmt.Errorf("keyslot: keys: %w", err)
		}
		for _, k := range batch {
			if !seen[k] && (max <= 0 || len(keys) < max) {
				seen[k] = true
				keys = append(keys, k)
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	return keys, nil
}

// Repair gives back the slots, and drops the waits, of jobs that no longer
// need them: a node died between a job's end and its release, or between
// taking a slot and dispatching. state reads jobs' states ("" for a job
// with no record); a holder whose job is not DISPATCHED or RUNNING and
// whose slot is older than minAge is freed (and announced), a waiter whose
// job is terminal or gone is dropped. At most perKey entries per key are
// looked at. A key whose states cannot be read is left as it is. limit
// gives a key's limit, for the freed slot's hand-off (nil or 0: the
// waiters are only told).
func (s *Slots) Repair(ctx context.Context, minAge time.Duration, perKey int64,
	state func(ctx context.Context, ids []string) ([]string, error), limit func(key string) int) (int, error) {
	keys, err := s.allKeys(ctx, 0)
	if err != nil {
		return 0, err
	}
	cutoff := strconv.FormatInt(time.Now().Add(-minAge).UnixMilli(), 10)
	freed := 0
	var readErr error
	for _, key := range keys {
		held, err := s.rdb.ZRangeByScore(ctx, s.Holders(key), &redis.ZRangeBy{Min: "(0", Max: cutoff, Count: perKey}).Result()
		if err != nil {
			readErr = err
			continue
		}
		waiting, err := s.rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: s.Waiters(key), Start: 0, Stop: perKey - 1}).Result()
		if err != nil {
			readErr = err
			continue
		}
		ids := append(append([]string{}, held...), waiting...)
		if len(ids) == 0 {
			continue
		}
		states, err := state(ctx, ids)
		if err != nil || len(states) != len(ids) {
			readErr = err
			continue
		}
		for i, id := range ids {
			st := states[i]
			if i < len(held) {
				if st == "DISPATCHED" || st == "RUNNING" {
					continue
				}
				lim := 0
				if limit != nil {
					lim = limit(key)
				}
				if ok, err := s.Release(ctx, key, id, time.Time{}, lim); err == nil && ok {
					freed++
				}
				continue
			}
			if st == "" || terminal(st) {
				_ = s.rdb.ZRem(ctx, s.Waiters(key), id).Err()
			}
		}
	}
	if readErr != nil {
		return freed, fmt.Errorf("keyslot: repair: a read failed, its key left as it was: %w", readErr)
	}
	return freed, nil
}

func terminal(state string) bool {
	switch state {
	case "SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT", "DENIED", "OUTPUT_QUARANTINED":
		return true
	}
	return false
}

// Subscribe calls wake(key, job) for each freed slot announced, until ctx
// ends: job is the waiter the slot was handed to, "" when the notice names
// none (any waiter of key may ask).
func (s *Slots) Subscribe(ctx context.Context, wake func(key, job string)) error {
	sub := s.rdb.Subscribe(ctx, s.Wakes())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		return fmt.Errorf("keyslot: subscribe: %w", err)
	}
	ch := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			key, job, _ := strings.Cut(m.Payload, "\n") // a key has no control character (CheckKey)
			wake(key, job)
		}
	}
}
