package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotFound: no schedule (or delayed job) with that id.
var ErrNotFound = errors.New("schedule: not found")

// ErrExists: a schedule with that id exists already.
var ErrExists = errors.New("schedule: exists")

// Store keeps schedules and delayed submits in Redis, under the node's key
// prefix. Keys (one hash tag each, so the scripts run on a cluster):
//
//	<p>{sched}:def        HASH id → Schedule JSON
//	<p>{sched}:due        ZSET id → next tick (unix ms); a paused schedule is absent
//	<p>{sched}:last       HASH id → Fired JSON
//	<p>{sched}:claim:<id>:<tick>   a tick's claim (SET NX, LeaseTTL)
//	<p>{sched}:ver        INCR'd by every change of def (Create, Pause, Resume, Delete)
//	<p>{delay}:due        ZSET job id → due time (unix ms), or a taker's lease end
//	<p>{delay}:job        HASH job id → Delayed JSON
//	<p>{delay}:taken      HASH job id → lease end (unix ms): taken by a replica to submit
//	<p>{delay}:gone       ZSET job id → until (unix ms): cancelled; its submit is not held again
type Store struct {
	rdb                        redis.UniversalClient
	def, due, last, claim, ver string
	delayDue, delayJob         string
	delayTaken, delayGone      string
	claimScript, advanceScript *redis.Script
	takeScript, cancelScript   *redis.Script
	addScript                  *redis.Script
}

// NewStore returns the store under prefix (the node's KeyPrefix, e.g.
// "troupe:").
func NewStore(rdb redis.UniversalClient, prefix string) *Store {
	return &Store{rdb: rdb,
		def: prefix + "{sched}:def", due: prefix + "{sched}:due", last: prefix + "{sched}:last",
		claim: prefix + "{sched}:claim:", ver: prefix + "{sched}:ver", delayDue: prefix + "{delay}:due", delayJob: prefix + "{delay}:job",
		delayTaken: prefix + "{delay}:taken", delayGone: prefix + "{delay}:gone",
		claimScript: redis.NewScript(claimLua), advanceScript: redis.NewScript(advanceLua),
		takeScript: redis.NewScript(takeLua), cancelScript: redis.NewScript(cancelLua),
		addScript: redis.NewScript(addLua)}
}

// claimLua: KEYS due, claim; ARGV id, tick, lease ms. The tick is claimed
// only while it is still the schedule's next tick and nobody holds it.
const claimLua = `
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) ~= tonumber(ARGV[2]) then return 0 end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then return 1 end
return 0`

// advanceLua: KEYS due, last; ARGV id, tick, next, fired JSON (or "").
// Moves the schedule from tick to next only if tick is still its next.
const advanceLua = `
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) ~= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[4]) end
return 1`

// takeLua: KEYS due, job, taken; ARGV now ms, lease end ms, limit. Takes
// up to limit due delayed jobs: each is re-scored to the lease end (a
// taker that dies leaves it due again then), marked taken (from then on a
// cancel no longer removes it: it is being submitted) and returned with
// its JSON.
const takeLua = `
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  local v = redis.call('HGET', KEYS[2], id)
  if v then
    redis.call('ZADD', KEYS[1], ARGV[2], id)
    redis.call('HSET', KEYS[3], id, ARGV[2])
    out[#out+1] = id
    out[#out+1] = v
  else
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[3], id)
  end
end
return out`

// cancelLua: KEYS due, job, taken, gone; ARGV id, now ms, until ms.
// Removes delayed job id unless a replica took it to submit: "CANCELLED"
// (it never runs; its submit, redelivered until then, is not held again),
// "TAKEN" (it is being submitted: the job's own cancel applies), "NONE"
// (no such delayed job).
const cancelLua = `
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return 'NONE' end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return 'TAKEN' end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
return 'CANCELLED'`

// addLua: KEYS due, job, gone; ARGV now ms, then (id, due ms, JSON) per
// job. Holds each job unless it is held already (a redelivered submit: the
// first stands) or was cancelled (its redelivered submit is dropped).
// Returns the number held.
const addLua = `
local n = 0
for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  local g = redis.call('ZSCORE', KEYS[3], id)
  if not g or tonumber(g) <= tonumber(ARGV[1]) then
    if redis.call('HSETNX', KEYS[2], id, ARGV[i+2]) == 1 then
      redis.call('ZADD', KEYS[1], 'NX', ARGV[i+1], id)
      n = n + 1
    end
  end
end
return n`

// CancelledKeep is how long a cancelled delayed job's submit is refused
// if it is delivered again: as long as the submit stream keeps a submit
// (bus.StreamMaxAge, 72 h), as a cancel mark (store.CancelMarkTTL).
const CancelledKeep = 73 * time.Hour

// Create stores s (validated) and schedules its first tick after now.
func (st *Store) Create(ctx context.Context, s *Schedule) error {
	if err := s.Validate(); err != nil {
		return err
	}
	s.NextTick, s.Last = nil, nil
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	ok, err := st.rdb.HSetNX(ctx, st.def, s.ID, data).Result()
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s", ErrExists, s.ID)
	}
	if err := st.rdb.Incr(ctx, st.ver).Err(); err != nil {
		return err
	}
	if s.Paused {
		return nil
	}
	return st.schedule(ctx, s, time.Now())
}

// schedule sets s's next tick to its first after t.
func (st *Store) schedule(ctx context.Context, s *Schedule, t time.Time) error {
	spec, err := s.Spec()
	if err != nil {
		return err
	}
	next := spec.Next(t)
	if next.IsZero() {
		return st.rdb.ZRem(ctx, st.due, s.ID).Err()
	}
	return st.rdb.ZAdd(ctx, st.due, redis.Z{Score: float64(next.UnixMilli()), Member: s.ID}).Err()
}

// Get returns schedule id with its next tick and last fired tick.
func (st *Store) Get(ctx context.Context, id string) (*Schedule, error) {
	pipe := st.rdb.Pipeline()
	d := pipe.HGet(ctx, st.def, id)
	n := pipe.ZScore(ctx, st.due, id)
	l := pipe.HGet(ctx, st.last, id)
	_, _ = pipe.Exec(ctx)
	data, err := d.Result()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	s := &Schedule{}
	if err := json.Unmarshal([]byte(data), s); err != nil {
		return nil, fmt.Errorf("schedule %s: %w", id, err)
	}
	if ms, err := n.Result(); err == nil {
		t := time.UnixMilli(int64(ms)).UTC()
		s.NextTick = &t
	}
	if v, err := l.Result(); err == nil {
		f := &Fired{}
		if json.Unmarshal([]byte(v), f) == nil {
			s.Last = f
		}
	}
	return s, nil
}

// List returns every schedule (ordered by id), tenant's only unless tenant
// is "".
func (st *Store) List(ctx context.Context, tenant string) ([]*Schedule, error) {
	ids, err := st.rdb.HKeys(ctx, st.def).Result()
	if err != nil {
		return nil, err
	}
	out := make([]*Schedule, 0, len(ids))
	for _, id := range ids {
		s, err := st.Get(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if tenant == "" || s.Tenant == tenant {
			out = append(out, s)
		}
	}
	sortByID(out)
	return out, nil
}

// Pause stops s ticking (its next tick is forgotten); Resume schedules its
// next tick after now (ticks while paused are not missed ticks: they are
// not fired).
func (st *Store) Pause(ctx context.Context, id string) error { return st.setPaused(ctx, id, true) }

// Resume: see Pause.
func (st *Store) Resume(ctx context.Context, id string) error { return st.setPaused(ctx, id, false) }

func (st *Store) setPaused(ctx context.Context, id string, paused bool) error {
	s, err := st.Get(ctx, id)
	if err != nil {
		return err
	}
	s.Paused = paused
	s.NextTick, s.Last = nil, nil
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	pipe := st.rdb.TxPipeline()
	pipe.HSet(ctx, st.def, id, data)
	pipe.Incr(ctx, st.ver)
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	if paused {
		return st.rdb.ZRem(ctx, st.due, id).Err()
	}
	return st.schedule(ctx, s, time.Now())
}

// Delete removes schedule id; a tick being fired now may still submit.
func (st *Store) Delete(ctx context.Context, id string) error {
	pipe := st.rdb.TxPipeline()
	n := pipe.HDel(ctx, st.def, id)
	pipe.ZRem(ctx, st.due, id)
	pipe.HDel(ctx, st.last, id)
	pipe.Incr(ctx, st.ver)
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	if n.Val() == 0 {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return nil
}

// defsVersion reads the count of definition changes (0: none counted,
// or lost with Redis's data).
func (st *Store) defsVersion(ctx context.Context) (int64, error) {
	v, err := st.rdb.Get(ctx, st.ver).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return v, err
}

// allDefs returns every schedule's stored definition (id → JSON) and the
// count of changes it was read at, in one transaction.
func (st *Store) allDefs(ctx context.Context) (map[string]string, int64, error) {
	pipe := st.rdb.TxPipeline()
	all := pipe.HGetAll(ctx, st.def)
	ver := pipe.Get(ctx, st.ver)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, 0, err
	}
	v, _ := ver.Int64() // 0 when no change was ever counted
	return all.Val(), v, nil
}

// restore writes back the definitions of defs (id → JSON) that Redis no
// longer holds, each unpaused one due at its first tick after since (ticks
// missed since then are its missed-tick policy's to fire or drop), and
// returns the ids restored. A definition Redis holds is left as it is.
func (st *Store) restore(ctx context.Context, defs map[string]string, since time.Time) ([]string, error) {
	if len(defs) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(defs))
	for id := range defs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	pipe := st.rdb.Pipeline()
	set := make([]*redis.BoolCmd, len(ids))
	for i, id := range ids {
		set[i] = pipe.HSetNX(ctx, st.def, id, defs[id])
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	var restored []string
	due := st.rdb.Pipeline()
	for i, id := range ids {
		if !set[i].Val() {
			continue
		}
		restored = append(restored, id)
		s := &Schedule{}
		if json.Unmarshal([]byte(defs[id]), s) != nil || s.Paused {
			continue
		}
		spec, err := s.Spec()
		if err != nil {
			continue
		}
		if next := spec.Next(since); !next.IsZero() {
			due.ZAddNX(ctx, st.due, redis.Z{Score: float64(next.UnixMilli()), Member: id})
		}
	}
	if len(restored) == 0 {
		return nil, nil
	}
	due.Incr(ctx, st.ver)
	if _, err := due.Exec(ctx); err != nil {
		return restored, err
	}
	return restored, nil
}

// dueSchedules returns the ids and ticks of schedules due at now (at most
// limit).
func (st *Store) dueSchedules(ctx context.Context, now time.Time, limit int64) ([]redis.Z, error) {
	return st.rdb.ZRangeByScoreWithScores(ctx, st.due, &redis.ZRangeBy{Min: "-inf",
		Max: strconv.FormatInt(now.UnixMilli(), 10), Count: limit}).Result()
}

func (st *Store) claimTick(ctx context.Context, id string, tick int64, lease time.Duration) (bool, error) {
	key := st.claim + id + ":" + strconv.FormatInt(tick, 10)
	n, err := st.claimScript.Run(ctx, st.rdb, []string{st.due, key}, id, tick, lease.Milliseconds()).Int()
	return n == 1, err
}

func (st *Store) advance(ctx context.Context, id string, tick, next int64, fired *Fired) error {
	last := ""
	if fired != nil {
		b, _ := json.Marshal(fired)
		last = string(b)
	}
	return st.advanceScript.Run(ctx, st.rdb, []string{st.due, st.last}, id, tick, next, last).Err()
}

// earliestTick returns the earliest next tick (ok false when no schedule
// ticks).
func (st *Store) earliestTick(ctx context.Context) (time.Time, bool, error) {
	return first(st.rdb.ZRangeWithScores(ctx, st.due, 0, 0).Result())
}

// earliestDelayed returns the earliest delayed job's due time less
// lookahead, and how many delayed jobs are held (one round trip).
func (st *Store) earliestDelayed(ctx context.Context, lookahead time.Duration) (time.Time, int64, error) {
	pipe := st.rdb.Pipeline()
	z := pipe.ZRangeWithScores(ctx, st.delayDue, 0, 0)
	n := pipe.ZCard(ctx, st.delayDue)
	if _, err := pipe.Exec(ctx); err != nil {
		return time.Time{}, 0, err
	}
	at, ok, _ := first(z.Result())
	if !ok {
		return time.Time{}, 0, nil
	}
	return at.Add(-lookahead), max(n.Val(), 1), nil
}

func first(zs []redis.Z, err error) (time.Time, bool, error) {
	if err != nil || len(zs) == 0 {
		return time.Time{}, false, err
	}
	return time.UnixMilli(int64(zs[0].Score)), true, nil
}
