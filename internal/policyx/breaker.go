package policyx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Breaker defaults: CAP's reference client values.
const (
	// BreakerFailuresDefault consecutive failed checks open the circuit.
	BreakerFailuresDefault = 3
	// BreakerOpenDefault is how long an open circuit refuses calls before
	// letting probes through.
	BreakerOpenDefault = 30 * time.Second
	// BreakerProbesDefault calls may go through a half-open circuit.
	BreakerProbesDefault = 3
	// BreakerCloseAfterDefault successful probes close the circuit.
	BreakerCloseAfterDefault = 2
)

// breakerRedisTimeout bounds one breaker round trip to Redis. The breaker
// is consulted before every check, so a hung Redis must cost little: past
// this, the process counts on its own.
const breakerRedisTimeout = 250 * time.Millisecond

// breakerRedisBackoff: after a Redis error the breaker counts locally for
// this long before trying Redis again, so that an outage of Redis does not
// add a timeout to every check.
const breakerRedisBackoff = time.Second

// BreakerConfig tunes the circuit breaker. Zero fields take the defaults.
type BreakerConfig struct {
	// Failures: consecutive failures that open the circuit.
	Failures int
	// OpenFor: how long an open circuit refuses calls.
	OpenFor time.Duration
	// Probes: calls let through a half-open circuit.
	Probes int
	// CloseAfter: successful probes that close it.
	CloseAfter int
}

func (c *BreakerConfig) defaults() {
	if c.Failures <= 0 {
		c.Failures = BreakerFailuresDefault
	}
	if c.OpenFor <= 0 {
		c.OpenFor = BreakerOpenDefault
	}
	if c.Probes <= 0 {
		c.Probes = BreakerProbesDefault
	}
	if c.CloseAfter <= 0 {
		c.CloseAfter = BreakerCloseAfterDefault
	}
	if c.CloseAfter > c.Probes {
		c.CloseAfter = c.Probes
	}
}

// BreakerState is a circuit's state.
type BreakerState int

// Circuit states; the values are those of the troupe_safety_breaker_state
// gauge.
const (
	BreakerClosed BreakerState = iota
	BreakerHalfOpen
	BreakerOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerHalfOpen:
		return "half-open"
	case BreakerOpen:
		return "open"
	}
	return "closed"
}

func parseState(s string) BreakerState {
	switch s {
	case "open":
		return BreakerOpen
	case "half":
		return BreakerHalfOpen
	}
	return BreakerClosed
}

// The shared breaker lives in one Redis hash per kernel address:
//
//	state      "open" | "half" (absent: closed)
//	failures   consecutive failures while closed
//	until      ms since epoch an open circuit stays open
//	probes     probes handed out in this half-open period
//	probe_at   ms when the last probe was handed out
//	successes  successful results while half-open
//
// Every replica runs these scripts against the same hash, so a circuit one
// replica opens is open for all of them at their next check. Times come
// from the callers' clocks: skew between replicas is milliseconds against
// a 30 s open period.

// breakerAcquireScript decides whether a call may go to the kernel.
// ARGV: now_ms, probes, probe_stale_ms, ttl_ms.
// Returns {allowed (0|1), state, failures}.
var breakerAcquireScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local st = redis.call('HMGET', KEYS[1], 'state', 'failures', 'until', 'probes', 'probe_at')
local state = st[1] or 'closed'
if state == 'open' then
  if now < tonumber(st[3] or 0) then return {0, 'open', 0} end
  redis.call('HSET', KEYS[1], 'state', 'half', 'probes', 1, 'successes', 0, 'probe_at', now)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {1, 'half', 0}
end
if state == 'half' then
  local probes = tonumber(st[4] or 0)
  if probes >= tonumber(ARGV[2]) then
    if now - tonumber(st[5] or 0) < tonumber(ARGV[3]) then return {0, 'half', 0} end
    -- Every probe is out and none has reported for longer than a check
    -- can take: their callers died. Hand out new probes.
    probes = 0
  end
  redis.call('HSET', KEYS[1], 'probes', probes + 1, 'probe_at', now)
  return {1, 'half', 0}
end
return {1, 'closed', tonumber(st[2] or 0)}
`)

// breakerRecordScript records a call's outcome.
// ARGV: now_ms, success (0|1), failures, open_ms, close_after, ttl_ms.
// Returns the state afterwards.
var breakerRecordScript = redis.NewScript(`
local now = tonumber(ARGV[1])
local st = redis.call('HMGET', KEYS[1], 'state', 'failures')
local state = st[1] or 'closed'
if state == 'open' then
  -- A call that started before the circuit opened: it changes nothing.
  return 'open'
end
if state == 'half' then
  if ARGV[2] == '1' then
    if redis.call('HINCRBY', KEYS[1], 'successes', 1) >= tonumber(ARGV[5]) then
      redis.call('DEL', KEYS[1])
      return 'closed'
    end
    return 'half'
  end
  redis.call('HSET', KEYS[1], 'state', 'open', 'until', now + tonumber(ARGV[4]), 'failures', 0, 'probes', 0, 'successes', 0)
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  return 'open'
end
if ARGV[2] == '1' then
  if tonumber(st[2] or 0) > 0 then redis.call('DEL', KEYS[1]) end
  return 'closed'
end
local f = redis.call('HINCRBY', KEYS[1], 'failures', 1)
if f >= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'state', 'open', 'until', now + tonumber(ARGV[4]), 'failures', 0)
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  return 'open'
end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 'closed'
`)

// breaker is the kernel client's circuit breaker: shared through Redis
// when it has one, counted in process when it has none or Redis fails.
type breaker struct {
	// Immutable after construction.
	cfg        BreakerConfig
	rdb        redis.UniversalClient // nil: local only
	key        string
	probeStale time.Duration
	ttl        time.Duration
	now        func() time.Time
	log        *slog.Logger
	onState    func(BreakerState)

	// Shared and safe.
	redisDownUntil atomic.Int64 // unix ms; Redis is skipped until then
	local          localBreaker
}

// permit is a caller's ticket for one call.
type permit struct {
	// report: the outcome must be recorded even if it is a success (the
	// circuit is half-open, or closed with failures counted).
	report bool
	// local: the permit came from the in-process breaker.
	local bool
}

func newBreaker(cfg BreakerConfig, rdb redis.UniversalClient, key string, callTimeout time.Duration,
	now func() time.Time, log *slog.Logger, onState func(BreakerState)) *breaker {
	cfg.defaults()
	b := &breaker{cfg: cfg, rdb: rdb, key: key, now: now, log: log, onState: onState,
		// A probe that has not reported within two call timeouts (plus
		// slack) never will.
		probeStale: 2*callTimeout + time.Second,
		// Long enough to outlive any open period; short enough that a
		// forgotten kernel's key goes away.
		ttl: max(10*cfg.OpenFor, 10*time.Minute)}
	b.local.cfg, b.local.probeStale = cfg, b.probeStale
	return b
}

func (b *breaker) useRedis(nowMs int64) bool {
	return b.rdb != nil && nowMs >= b.redisDownUntil.Load()
}

func (b *breaker) redisFailed(nowMs int64, err error) {
	if b.redisDownUntil.Swap(nowMs+breakerRedisBackoff.Milliseconds()) < nowMs {
		b.log.Warn("safety breaker: Redis unavailable, counting in process", "err", err)
	}
}

// acquire returns whether a call may go to the kernel now.
func (b *breaker) acquire(ctx context.Context) (permit, bool) {
	now := b.now()
	ms := now.UnixMilli()
	if b.useRedis(ms) {
		rctx, cancel := context.WithTimeout(ctx, breakerRedisTimeout)
		res, err := breakerAcquireScript.Run(rctx, b.rdb, []string{b.key}, ms, b.cfg.Probes,
			b.probeStale.Milliseconds(), b.ttl.Milliseconds()).Slice()
		cancel()
		if err == nil && len(res) == 3 {
			allowed, _ := res[0].(int64)
			state, _ := res[1].(string)
			failures, _ := res[2].(int64)
			st := parseState(state)
			b.onState(st)
			return permit{report: st != BreakerClosed || failures > 0}, allowed == 1
		}
		if err == nil {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		if ctx.Err() == nil {
			b.redisFailed(ms, err)
		}
	}
	ok, st := b.local.acquire(now)
	b.onState(st)
	return permit{report: true, local: true}, ok
}

// record reports a call's outcome. The local breaker always hears it, so
// that it is warm when Redis goes away.
func (b *breaker) record(ctx context.Context, p permit, success bool) {
	now := b.now()
	st := b.local.record(now, success)
	if p.local || (success && !p.report) {
		if p.local {
			b.onState(st)
		}
		return
	}
	ms := now.UnixMilli()
	if !b.useRedis(ms) {
		b.onState(st)
		return
	}
	// Detached from the caller: a caller that gave up must still have its
	// outcome counted, or a hanging kernel would never open the circuit.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), breakerRedisTimeout)
	defer cancel()
	succ := 0
	if success {
		succ = 1
	}
	state, err := breakerRecordScript.Run(rctx, b.rdb, []string{b.key}, ms, succ, b.cfg.Failures,
		b.cfg.OpenFor.Milliseconds(), b.cfg.CloseAfter, b.ttl.Milliseconds()).Text()
	if err != nil {
		b.redisFailed(ms, err)
		b.onState(st)
		return
	}
	b.onState(parseState(state))
}

// state reports the circuit's state as this process sees it (for tests
// and the CLI): Redis's when reachable, else the local one.
func (b *breaker) state(ctx context.Context) BreakerState {
	if b.rdb != nil {
		rctx, cancel := context.WithTimeout(ctx, breakerRedisTimeout)
		defer cancel()
		s, err := b.rdb.HGet(rctx, b.key, "state").Result()
		if err == nil || errors.Is(err, redis.Nil) {
			return parseState(s) // no hash, or no state field: closed
		}
	}
	return b.local.current()
}

// localBreaker is the same state machine in process memory.
type localBreaker struct {
	cfg        BreakerConfig
	probeStale time.Duration

	mu        sync.Mutex
	st        BreakerState
	failures  int
	until     time.Time
	probes    int
	probeAt   time.Time
	successes int
}

func (l *localBreaker) acquire(now time.Time) (bool, BreakerState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.st {
	case BreakerOpen:
		if now.Before(l.until) {
			return false, l.st
		}
		l.st, l.probes, l.successes, l.probeAt = BreakerHalfOpen, 1, 0, now
		return true, l.st
	case BreakerHalfOpen:
		if l.probes >= l.cfg.Probes {
			if now.Sub(l.probeAt) < l.probeStale {
				return false, l.st
			}
			l.probes = 0
		}
		l.probes++
		l.probeAt = now
		return true, l.st
	}
	return true, l.st
}

func (l *localBreaker) record(now time.Time, success bool) BreakerState {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.st {
	case BreakerOpen:
	case BreakerHalfOpen:
		if success {
			l.successes++
			if l.successes >= l.cfg.CloseAfter {
				l.st, l.failures, l.probes, l.successes = BreakerClosed, 0, 0, 0
			}
		} else {
			l.st, l.until, l.probes, l.successes = BreakerOpen, now.Add(l.cfg.OpenFor), 0, 0
		}
	default:
		if success {
			l.failures = 0
		} else if l.failures++; l.failures >= l.cfg.Failures {
			l.st, l.until, l.failures = BreakerOpen, now.Add(l.cfg.OpenFor), 0
		}
	}
	return l.st
}

func (l *localBreaker) current() BreakerState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}
