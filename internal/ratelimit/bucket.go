package ratelimit

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store runs the bucket script. A bucket is one hash, hash-tagged by its
// name so it lives in one Redis Cluster slot:
//
//	<p>{rl:<name>}   HASH tokens, ts (Redis TIME, ms), limit, per, burst,
//	                 and w:<node> = "<jobs>|<units>|<ms>": the node's waiters
//	                 at its last call (troupe ctl limits sums the fresh ones)
type Store struct {
	rdb    redis.UniversalClient
	prefix string
}

// NewStore returns the store under prefix (the node's KeyPrefix).
func NewStore(rdb redis.UniversalClient, prefix string) *Store {
	return &Store{rdb: rdb, prefix: prefix}
}

// Key is bucket name's Redis key.
func (s *Store) Key(name string) string { return s.prefix + "{rl:" + name + "}" }

// takeScript: KEYS bucket; ARGV limit, per ms, burst, want, first, node,
// jobs, units. Refills the bucket by the time passed on Redis's clock (one
// clock for every replica), grants min(want, whole tokens), and says how
// long until first more tokens are there. It records the caller's waiters
// in the same call. The key expires once it would be full anyway, so an
// idle bucket costs nothing. Returns {granted, level (string), wait ms,
// fresh (1: the key was absent)}.
var takeScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, per, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local want, first = tonumber(ARGV[4]), tonumber(ARGV[5])
local h = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(h[1]), tonumber(h[2])
local fresh = 0
if tokens == nil or ts == nil then
  tokens, ts, fresh = burst, now, 1
end
if now > ts then
  tokens = math.min(burst, tokens + (now - ts) * limit / per)
  ts = now
end
if tokens > burst then tokens = burst end
local got = 0
if want > 0 then
  got = math.min(want, math.floor(tokens))
  tokens = tokens - got
end
local wait = 0
if first > 0 and tokens < first then
  wait = math.ceil((first - tokens) * per / limit)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', ts, 'limit', limit, 'per', per, 'burst', burst,
  'w:' .. ARGV[6], ARGV[7] .. '|' .. math.max(tonumber(ARGV[8]) - got, 0) .. '|' .. now)
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) * per / limit) + 60000)
return {got, tostring(tokens), wait, fresh}
`)

// Take is one call of the script for bucket b: want tokens for the node's
// waiters (jobs of them, units in all), and how long until first more.
type Take struct {
	Granted int
	Level   float64
	Wait    time.Duration
	// Fresh: the bucket's key was absent (first use, expired full, or
	// Redis lost its data).
	Fresh bool
}

// Take runs the script once.
func (s *Store) Take(ctx context.Context, b *Bucket, want, first int, node string, jobs, units int) (Take, error) {
	r, err := takeScript.Run(ctx, s.rdb, []string{s.Key(b.Name)}, b.Rate, b.Per.Milliseconds(), b.Burst, want, first,
		node, jobs, units).Slice()
	if err != nil {
		return Take{}, err
	}
	if len(r) != 4 {
		return Take{}, fmt.Errorf("ratelimit: script answered %d values", len(r))
	}
	got, _ := r[0].(int64)
	lvl, _ := r[1].(string)
	level, _ := strconv.ParseFloat(lvl, 64)
	wait, _ := r[2].(int64)
	fresh, _ := r[3].(int64)
	return Take{Granted: int(got), Level: level, Wait: time.Duration(wait) * time.Millisecond, Fresh: fresh == 1}, nil
}

// Level is what Redis holds of a bucket, for troupe ctl limits.
type Level struct {
	Name string `json:"name"`
	// Tokens is the level, refilled to now (Redis's clock) but not
	// written; Burst the most it holds.
	Tokens  float64  `json:"tokens"`
	Limit   int      `json:"limit"`
	PerMS   int64    `json:"per_ms"`
	Burst   int      `json:"burst"`
	Waiting []Waiter `json:"waiting_by_node,omitempty"`
}

// Waiter is one node's waiters on a bucket, as its last call recorded
// them: Jobs waiting before the call, Units still wanted after it.
type Waiter struct {
	Node  string `json:"node"`
	Jobs  int    `json:"jobs"`
	Units int    `json:"units"`
	AtMS  int64  `json:"at_ms"`
}

// waiterFresh: a node's waiter record older than this is not shown (the
// node stopped calling: no waiters, or gone).
const waiterFresh = 10 * time.Second

// Read returns bucket b's level and the nodes' recorded waiters (two
// commands: TIME and HGETALL; a read for operators, not the job path).
func (s *Store) Read(ctx context.Context, b *Bucket) (Level, error) {
	l := Level{Name: b.Name, Tokens: float64(b.Burst), Limit: b.Rate, PerMS: b.Per.Milliseconds(), Burst: b.Burst}
	now, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return l, err
	}
	h, err := s.rdb.HGetAll(ctx, s.Key(b.Name)).Result()
	if err != nil {
		return l, err
	}
	nowMS := now.UnixMilli()
	if tok, err := strconv.ParseFloat(h["tokens"], 64); err == nil {
		ts, _ := strconv.ParseInt(h["ts"], 10, 64)
		if nowMS > ts {
			tok += float64(nowMS-ts) * float64(b.Rate) / float64(b.Per.Milliseconds())
		}
		l.Tokens = min(tok, float64(b.Burst))
	}
	for k, v := range h {
		node, ok := strings.CutPrefix(k, "w:")
		if !ok {
			continue
		}
		var w Waiter
		w.Node = node
		parts := strings.Split(v, "|")
		if len(parts) != 3 {
			continue
		}
		w.Jobs, _ = strconv.Atoi(parts[0])
		w.Units, _ = strconv.Atoi(parts[1])
		w.AtMS, _ = strconv.ParseInt(parts[2], 10, 64)
		if nowMS-w.AtMS > waiterFresh.Milliseconds() || w.Units == 0 {
			continue
		}
		l.Waiting = append(l.Waiting, w)
	}
	return l, nil
}
