package store

import "github.com/redis/go-redis/v9"

// Every write that changes a job's state is one of these scripts, so a
// transition is a single atomic compare-and-set. All keys a script touches
// share the job's hash tag (see Keys), which keeps each script on one Redis
// Cluster node. Index keys are built inside the script from the shard's
// prefix; they carry the same tag, so they live in the same slot.
//
// History entries are "unix_ms|from|to|reason|node".

// activateScript takes a job's lock and reports its state, creating the record
// in PENDING when it does not exist and the caller asks for it.
//
// KEYS: job, hist, lock
// ARGV: node, now_ms, lock_ttl_ms, create(0|1), idx_prefix, job_id, topic,
//
//	tenant, trace_id, request(bytes)
//
// Returns {status, state, fence, request, worker, subject, lock_value} with
// status one of CREATED, ADOPTED, BUSY (another node holds the lock),
// TERMINAL (no lock taken), NOTFOUND.
var activateScript = redis.NewScript(`
local node = ARGV[1]
local now = ARGV[2]
local cur = redis.call('GET', KEYS[3])
local st = redis.call('HGET', KEYS[1], 's')
if cur and string.sub(cur, 1, #node + 1) ~= node .. '|' then
  return {'BUSY', st or '', '0', '', '', '', cur}
end
if not st then
  if ARGV[4] ~= '1' then
    return {'NOTFOUND', '', '0', '', '', '', ''}
  end
  redis.call('HSET', KEYS[1], 's', 'PENDING', 'fence', 1, 'topic', ARGV[7], 'tenant', ARGV[8],
    'trace', ARGV[9], 'req', ARGV[10], 'created', now, 'updated', now, 'node', node,
    'reason', 'submitted', 'attempts', 0)
  redis.call('RPUSH', KEYS[2], now .. '||PENDING|submitted|' .. node)
  redis.call('ZADD', ARGV[5] .. 'PENDING', now, ARGV[6])
  redis.call('SET', KEYS[3], node .. '|1', 'PX', ARGV[3])
  return {'CREATED', 'PENDING', '1', '', '', '', ''}
end
if st == 'SUCCEEDED' or st == 'FAILED' or st == 'TIMEOUT' or st == 'CANCELLED' or st == 'DENIED' or st == 'OUTPUT_QUARANTINED' then
  return {'TERMINAL', st, '0', '', '', '', cur or ''}
end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'node', node)
redis.call('SET', KEYS[3], node .. '|' .. fence, 'PX', ARGV[3])
local f = redis.call('HMGET', KEYS[1], 'req', 'worker', 'subj')
return {'ADOPTED', st, tostring(fence), f[1] or '', f[2] or '', f[3] or '', ''}
`)

// transitionScript moves a job from one of the expected states to a new one,
// only while the caller's lock value ("<node>|<fence>") is the current one.
//
// KEYS: job, hist, lock
// ARGV: lock_value, node, expected (comma-separated states), to, now_ms,
//
//	reason, idx_prefix, job_id, terminal(0|1), retention_s,
//	field, value, ... (extra record fields)
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
redis.call('HSET', KEYS[1], 's', to, 'updated', now, 'reason', ARGV[6])
if #ARGV > 10 then
  redis.call('HSET', KEYS[1], unpack(ARGV, 11))
end
redis.call('RPUSH', KEYS[2], now .. '|' .. st .. '|' .. to .. '|' .. ARGV[6] .. '|' .. ARGV[2])
if st ~= to then
  redis.call('ZREM', ARGV[7] .. st, ARGV[8])
end
redis.call('ZADD', ARGV[7] .. to, now, ARGV[8])
if ARGV[9] == '1' then
  redis.call('DEL', KEYS[3])
  local keep = tonumber(ARGV[10])
  if keep > 0 then
    redis.call('EXPIRE', KEYS[1], keep)
    redis.call('EXPIRE', KEYS[2], keep)
    redis.call('ZREMRANGEBYSCORE', ARGV[7] .. to, '-inf', tonumber(now) - keep * 1000)
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

var allScripts = []*redis.Script{activateScript, transitionScript, releaseScript, renewScript}
