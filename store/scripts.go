package store

import "github.com/redis/go-redis/v9"

// Every write that changes a job's state is one of these scripts, so a
// transition is a single atomic compare-and-set. All keys a script touches
// share the job's hash tag (see Keys), which keeps each script on one Redis
// Cluster node. The shard's index and due-set names are built inside the
// script from the shard's tag; they carry the same tag, so they live in the
// same slot.
//
// History entries are "unix_ms|from|to|reason|node".

// activateScript takes a job's lock and reports its state, creating the record
// in PENDING when it does not exist and the caller asks for it.
//
// KEYS: job, hist, lock
// ARGV: node, now_ms, lock_ttl_ms, create(0|1), shard_tag, job_id, topic,
//
//	tenant, trace_id, request(bytes), rescue_at_ms
//
// A created job is due at rescue_at: every live job has a due entry from
// its first moment, so a job whose actor or node dies before it records a
// wait of its own is still woken (by the due poller) and never stranded.
// Returns {status, state, fence, holder, field, value, ...} with status one of
// CREATED, ADOPTED (the record's fields follow), BUSY (another node holds the
// lock), TERMINAL (no lock taken), NOTFOUND. A job that is terminal or
// missing loses its due entry: nothing will ever wait for it.
var activateScript = redis.NewScript(`
local node = ARGV[1]
local now = ARGV[2]
local cur = redis.call('GET', KEYS[3])
local st = redis.call('HGET', KEYS[1], 's')
if cur and string.sub(cur, 1, #node + 1) ~= node .. '|' then
  return {'BUSY', st or '', '0', cur}
end
if not st then
  if ARGV[4] ~= '1' then
    redis.call('ZREM', ARGV[5] .. 'due', ARGV[6])
    return {'NOTFOUND', '', '0', ''}
  end
  redis.call('HSET', KEYS[1], 's', 'PENDING', 'fence', 1, 'topic', ARGV[7], 'tenant', ARGV[8],
    'trace', ARGV[9], 'req', ARGV[10], 'created', now, 'updated', now, 'node', node,
    'reason', 'submitted', 'attempts', 0)
  redis.call('RPUSH', KEYS[2], now .. '||PENDING|submitted|' .. node)
  redis.call('ZADD', ARGV[5] .. 'idx:PENDING', now, ARGV[6])
  redis.call('ZADD', ARGV[5] .. 'due', ARGV[11], ARGV[6])
  redis.call('SET', KEYS[3], node .. '|1', 'PX', ARGV[3])
  return {'CREATED', 'PENDING', '1', ''}
end
if st == 'SUCCEEDED' or st == 'FAILED' or st == 'TIMEOUT' or st == 'CANCELLED' or st == 'DENIED' or st == 'OUTPUT_QUARANTINED' then
  redis.call('ZREM', ARGV[5] .. 'due', ARGV[6])
  return {'TERMINAL', st, '0', cur or ''}
end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'node', node)
redis.call('SET', KEYS[3], node .. '|' .. fence, 'PX', ARGV[3])
local out = {'ADOPTED', st, tostring(fence), ''}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do out[#out + 1] = all[i] end
return out
`)

// transitionScript moves a job from one of the expected states to a new one,
// only while the caller's lock value ("<node>|<fence>") is the current one.
//
// KEYS: job, hist, lock
// ARGV: lock_value, node, expected (comma-separated states), to, now_ms,
//
//	reason, shard_tag, job_id, lock_after (keep|release|terminal),
//	retention_s, due_ms (0 keep, -1 clear, >0 set), field, value, ...
//
// Returns {status, state_before} with status OK, FENCED (lock value differs:
// this owner is stale), NOTFOUND or CONFLICT (state not expected).
var transitionScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[3])
if cur ~= ARGV[1] then
  return {'FENCED', cur or ''}
end
local st = redis.call('HGET', KEYS[1], 's')
if not st then
  return {'NOTFOUND', ''}
end
local ok = false
for e in string.gmatch(ARGV[3], '[^,]+') do
  if e == st then ok = true break end
end
if not ok then
  return {'CONFLICT', st}
end
local to = ARGV[4]
local now = ARGV[5]
local tag = ARGV[7]
redis.call('HSET', KEYS[1], 's', to, 'updated', now, 'reason', ARGV[6])
if #ARGV > 11 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 12))
end
redis.call('RPUSH', KEYS[2], now .. '|' .. st .. '|' .. to .. '|' .. ARGV[6] .. '|' .. ARGV[2])
if st ~= to then
  redis.call('ZREM', tag .. 'idx:' .. st, ARGV[8])
end
redis.call('ZADD', tag .. 'idx:' .. to, now, ARGV[8])
local due = ARGV[11]
if ARGV[9] == 'terminal' or due == '-1' then
  redis.call('ZREM', tag .. 'due', ARGV[8])
elseif due ~= '0' then
  redis.call('ZADD', tag .. 'due', due, ARGV[8])
end
if ARGV[9] == 'release' then
  redis.call('DEL', KEYS[3])
elseif ARGV[9] == 'terminal' then
  redis.call('DEL', KEYS[3])
  local keep = tonumber(ARGV[10])
  if keep > 0 then
    redis.call('EXPIRE', KEYS[1], keep)
    redis.call('EXPIRE', KEYS[2], keep)
    redis.call('ZREMRANGEBYSCORE', tag .. 'idx:' .. to, '-inf', tonumber(now) - keep * 1000)
  end
end
return {'OK', st}
`)

// releaseScript deletes a lock only if the caller still holds it.
// KEYS: lock. ARGV: lock_value. Returns 1 if released.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// renewScript extends a lock only if the caller still holds it.
// KEYS: lock. ARGV: lock_value, ttl_ms. Returns 1 if renewed.
var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// approveScript records a human decision on a job that waits for one, and
// makes the job due now so a replica wakes it.
// KEYS: job. ARGV: decision (approved|rejected), by, reason, hash, now_ms,
// shard_tag, job_id. Returns {status, detail}: OK, NOTFOUND,
// STATE (not APPROVAL_REQUIRED; detail = state), HASH (hash differs; detail = stored hash).
var approveScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 's')
if not st then return {'NOTFOUND', ''} end
if st ~= 'APPROVAL_REQUIRED' then return {'STATE', st} end
local h = redis.call('HGET', KEYS[1], 'job_hash') or ''
if ARGV[4] ~= '' and ARGV[4] ~= h then return {'HASH', h} end
redis.call('HSET', KEYS[1], 'approval_decision', ARGV[1], 'approval_by', ARGV[2],
  'approval_reason', ARGV[3], 'approval_hash', h, 'approval_at', ARGV[5])
redis.call('ZADD', ARGV[6] .. 'due', ARGV[5], ARGV[7])
return {'OK', h}
`)

// claimScript claims an idempotency key for a job, or names the job that
// already holds it. KEYS: idem key. ARGV: job_id, ttl_s. Returns the holder.
var claimScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return ARGV[1]
`)

// dueScript returns up to ARGV[2] jobs of one shard due at or before ARGV[1]
// and moves each to ARGV[3] (unix ms), so a job whose wake-up did not take (its
// owner is alive and will act itself) is offered again later, not every tick.
// KEYS: due.
var dueScript = redis.NewScript(`
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local later = tonumber(ARGV[3])
for _, id in ipairs(ids) do
  redis.call('ZADD', KEYS[1], 'XX', later, id)
end
return ids
`)

var allScripts = []*redis.Script{activateScript, transitionScript, releaseScript, renewScript,
	approveScript, claimScript, dueScript}
