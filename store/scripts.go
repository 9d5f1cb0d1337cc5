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

// shardWritesLua defines shardWrites, which activateScript and
// transitionScript use to apply a Transition's Adds and Sets: from ARGV[a]
// on, m, then m × (key suffix under the shard tag, score, member,
// trim_below, ttl_ms) to ZADD, then h, then h × (key suffix, field, value,
// ttl_ms) to HSET. trim_below > 0 first drops the sorted set's entries
// scored below it; ttl_ms > 0 then sets the key's expiry. It returns the
// index of the first ARGV after them.
const shardWritesLua = `
local function shardWrites(tag, a)
  local m = tonumber(ARGV[a])
  for i = 0, m - 1 do
    local b = a + 1 + 5 * i
    local k = tag .. ARGV[b]
    if tonumber(ARGV[b + 3]) > 0 then
      redis.call('ZREMRANGEBYSCORE', k, '-inf', '(' .. ARGV[b + 3])
    end
    redis.call('ZADD', k, ARGV[b + 1], ARGV[b + 2])
    if tonumber(ARGV[b + 4]) > 0 then
      redis.call('PEXPIRE', k, ARGV[b + 4])
    end
  end
  a = a + 1 + 5 * m
  local h = tonumber(ARGV[a])
  for i = 0, h - 1 do
    local b = a + 1 + 4 * i
    local k = tag .. ARGV[b]
    redis.call('HSET', k, ARGV[b + 1], ARGV[b + 2])
    if tonumber(ARGV[b + 3]) > 0 then
      redis.call('PEXPIRE', k, ARGV[b + 3])
    end
  end
  return a + 1 + 4 * h
end
`

// activateScript takes a job's lock and reports its state. When the job does
// not exist and the caller asks for it, the script creates it and applies the
// caller's plan — the first decision about the job (for example PENDING →
// SCHEDULED → DISPATCHED to a chosen worker) — in the same call, so the happy
// path costs one script to create and dispatch and one to finish.
//
// KEYS: job, hist, lock
// ARGV: node, now_ms, lock_ttl_ms, create(0|1), shard_tag, job_id, topic,
//
//	tenant, trace_id, request(bytes), rescue_at_ms, lock_after
//	(keep|release|terminal), due_ms (0 = rescue_at, -1 none, >0 set),
//	retention_s, n, then n pairs (to, reason), then the shard writes
//	(see shardWritesLua), then field, value, ...
//
// A created job with no due time of its own is due at rescue_at: every live
// job has a due entry from its first moment, so a job whose actor or node
// dies before it records a wait of its own is still woken by the due poller.
//
// A lock is "<node>|<fence>" with a TTL (renewed by its node), or
// "<node>|<fence>|p" with none: a parked job's lock, held through the node's
// lease (the key "<tag>alive:<node>", see Keys.Alive). A parked lock of a
// node whose lease has expired is free: activating it adopts the job. Any
// activation of a parked job takes it out of its node's parked set and puts
// its deadline back in the due set.
//
// Returns {status, state, fence, holder, field, value, ...} with status one of
// CREATED (state = where the plan left it), ADOPTED (holder = the lock value
// before, so the caller sees whether the job was parked; the record's fields
// follow), BUSY (another node holds the lock), TERMINAL (no lock taken),
// NOTFOUND. A job that is terminal or missing loses its due entry: nothing
// will ever wait for it.
var activateScript = redis.NewScript(shardWritesLua + `
local node = ARGV[1]
local now = ARGV[2]
local tag = ARGV[5]
local id = ARGV[6]
local cur = redis.call('GET', KEYS[3])
local st = redis.call('HGET', KEYS[1], 's')
local terminal = st == 'SUCCEEDED' or st == 'FAILED' or st == 'TIMEOUT' or st == 'CANCELLED' or st == 'DENIED' or st == 'OUTPUT_QUARANTINED'
local parkedBy = nil
if cur then
  local owner = string.match(cur, '^[^|]*')
  if string.sub(cur, -2) == '|p' then
    -- A parked lock is held through its node's lease, not its own TTL.
    if owner ~= node and redis.call('EXISTS', tag .. 'alive:' .. owner) == 1 then
      return {'BUSY', st or '', '0', cur}
    end
    parkedBy = owner
  elseif owner ~= node then
    return {'BUSY', st or '', '0', cur}
  end
end
if parkedBy then
  -- Unpark: the job leaves its owner's parked set, and its deadline goes
  -- back to the shard's due set, where every live wait is.
  redis.call('ZREM', tag .. 'parked:' .. parkedBy, id)
  local d = tonumber(redis.call('HGET', KEYS[1], 'deadline') or '')
  if st and not terminal and d and d > 0 then
    redis.call('ZADD', tag .. 'due', d, id)
  end
  if not st or terminal then
    redis.call('DEL', KEYS[3])
  end
end
if not st then
  if ARGV[4] ~= '1' then
    redis.call('ZREM', tag .. 'due', id)
    redis.call('ZREM', tag .. 'leases', id)
    return {'NOTFOUND', '', '0', ''}
  end
  local n = tonumber(ARGV[15])
  local hist = {now .. '||PENDING|submitted|' .. node}
  local prev, reason = 'PENDING', 'submitted'
  for i = 1, n do
    local to = ARGV[14 + 2 * i]
    reason = ARGV[15 + 2 * i]
    hist[#hist + 1] = now .. '|' .. prev .. '|' .. to .. '|' .. reason .. '|' .. node
    prev = to
  end
  local first = shardWrites(tag, 16 + 2 * n)
  local f = {'s', prev, 'fence', 1, 'topic', ARGV[7], 'tenant', ARGV[8], 'trace', ARGV[9], 'req', ARGV[10],
    'created', now, 'updated', now, 'node', node, 'reason', reason, 'attempts', 0}
  for i = first, #ARGV do f[#f + 1] = ARGV[i] end
  redis.call('HSET', KEYS[1], unpack(f))
  redis.call('RPUSH', KEYS[2], unpack(hist))
  redis.call('ZADD', tag .. 'idx:' .. prev, now, id)
  local lock, due = ARGV[12], ARGV[13]
  if lock ~= 'terminal' and due ~= '-1' then
    if due == '0' then due = ARGV[11] end
    redis.call('ZADD', tag .. 'due', due, id)
  end
  if lock == 'keep' then
    redis.call('SET', KEYS[3], node .. '|1', 'PX', ARGV[3])
    redis.call('ZADD', tag .. 'leases', tonumber(now) + 2 * tonumber(ARGV[3]), id)
  elseif lock == 'terminal' and tonumber(ARGV[14]) > 0 then
    redis.call('EXPIRE', KEYS[1], ARGV[14])
    redis.call('EXPIRE', KEYS[2], ARGV[14])
  end
  return {'CREATED', prev, '1', ''}
end
if terminal then
  redis.call('ZREM', tag .. 'due', id)
  redis.call('ZREM', tag .. 'leases', id)
  return {'TERMINAL', st, '0', cur or ''}
end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'node', node)
redis.call('SET', KEYS[3], node .. '|' .. fence, 'PX', ARGV[3])
redis.call('ZADD', tag .. 'leases', tonumber(now) + 2 * tonumber(ARGV[3]), id)
local out = {'ADOPTED', st, tostring(fence), cur or ''}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do out[#out + 1] = all[i] end
return out
`)

// transitionScript moves a job along a path of states in one atomic step,
// only if it is in one of the expected states and only while the caller's
// lock value ("<node>|<fence>") is the current one.
//
// KEYS: job, hist, lock
// ARGV: lock_value, node, expected (comma-separated states), now_ms,
//
//	shard_tag, job_id, lock_after (keep|release|terminal), retention_s,
//	due_ms (0 keep, -1 clear, >0 set), n, then n pairs (to, reason), then
//	the shard writes made in the same step (saga records and triggers; see
//	shardWritesLua), then field, value, ...
//
// Returns {status, state_before} with status OK, FENCED (lock value differs:
// this owner is stale; then state_before is the lock's value, and the
// record's "op" field and state follow), NOTFOUND or CONFLICT (state not
// expected; then a third element: the record's "op" field, the identity of
// the write that put it there — see Transition.Op). The "op" field tells a
// retried write whether its first try applied: a write that released the
// lock (a terminal one) is FENCED when tried again.
var transitionScript = redis.NewScript(shardWritesLua + `
local cur = redis.call('GET', KEYS[3])
if cur ~= ARGV[1] then
  local rec = redis.call('HMGET', KEYS[1], 'op', 's')
  return {'FENCED', cur or '', rec[1] or '', rec[2] or ''}
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
  return {'CONFLICT', st, redis.call('HGET', KEYS[1], 'op') or ''}
end
local now, tag, id = ARGV[4], ARGV[5], ARGV[6]
local n = tonumber(ARGV[10])
local hist = {}
local prev, reason = st, ''
for i = 1, n do
  local to = ARGV[9 + 2 * i]
  reason = ARGV[10 + 2 * i]
  hist[#hist + 1] = now .. '|' .. prev .. '|' .. to .. '|' .. reason .. '|' .. ARGV[2]
  prev = to
end
local first = shardWrites(tag, 11 + 2 * n)
local f = {'s', prev, 'updated', now, 'reason', reason}
for i = first, #ARGV do f[#f + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('RPUSH', KEYS[2], unpack(hist))
if st ~= prev then
  redis.call('ZREM', tag .. 'idx:' .. st, id)
end
redis.call('ZADD', tag .. 'idx:' .. prev, now, id)
local lock, due = ARGV[7], ARGV[9]
if lock == 'terminal' or due == '-1' then
  redis.call('ZREM', tag .. 'due', id)
elseif due ~= '0' then
  redis.call('ZADD', tag .. 'due', due, id)
end
if lock == 'release' then
  redis.call('DEL', KEYS[3])
  redis.call('ZREM', tag .. 'leases', id)
elseif lock == 'terminal' then
  redis.call('DEL', KEYS[3])
  redis.call('ZREM', tag .. 'leases', id)
  local keep = tonumber(ARGV[8])
  if keep > 0 then
    redis.call('EXPIRE', KEYS[1], keep)
    redis.call('EXPIRE', KEYS[2], keep)
  end
end
return {'OK', st}
`)

// releaseScript deletes a lock (and the job's lease) only if the caller
// still holds it. KEYS: lock, leases. ARGV: lock_value, job_id. Returns 1
// if released.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// renewScript extends a lock, and the job's lease, only if the caller still
// holds it. KEYS: lock, leases. ARGV: lock_value, ttl_ms, job_id, lease_until_ms.
// Returns 1 if renewed.
//
// The lease (a per-shard sorted set, score = when the owner must have renewed
// by) is what makes a dead owner visible: when a node dies its leases stop
// moving, and the due poller wakes every job whose lease ran out, so another
// replica adopts it without waiting for a result or a deadline.
var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// parkScript parks a DISPATCHED or RUNNING job whose actor is about to stop
// (it waits for its worker, which may take hours): the lock stays the
// node's but loses its TTL and gains the "|p" mark, so no per-job renewal
// keeps it — the node's lease does (Keys.Alive). The job leaves the lease
// set (nothing renews it) and the due set (a poller on another node must not
// wake it: it would find the lock busy), and joins the node's parked set
// with its due time as score, where the node's own poll finds it.
// KEYS: lock, leases, parked, alive, due. ARGV: lock_value, job_id, due_ms,
// lease_ttl_ms. Returns 1 if parked, 0 if the caller no longer holds the lock.
//
// The alive key is set if missing, so a node can never hold a parked lock
// without a lease: the renewer sets it at start, but a job may park first.
var parkScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1] .. '|p')
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[5], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
redis.call('SET', KEYS[4], '1', 'PX', ARGV[4], 'NX')
return 1
`)

// renewManyScript renews many live locks of one shard in one call: each
// lock (and its lease) is extended only if the caller still holds it.
// KEYS: leases. ARGV: ttl_ms, lease_until_ms, shard_tag, then job_id,
// lock_value pairs. Returns per pair 1 (renewed), 0 (another holder) or -1
// (no lock at all: it expired, or Redis lost its data).
var renewManyScript = redis.NewScript(`
local out = {}
for i = 4, #ARGV, 2 do
  local k = ARGV[3] .. 'lock:' .. ARGV[i]
  local cur = redis.call('GET', k)
  if cur == ARGV[i + 1] then
    redis.call('PEXPIRE', k, ARGV[1])
    redis.call('ZADD', KEYS[1], ARGV[2], ARGV[i])
    out[#out + 1] = 1
  elseif cur then
    out[#out + 1] = 0
  else
    out[#out + 1] = -1
  end
end
return out
`)

// deadNodeScript changes a dead node's score in the nodes set from its last
// renewal to ARGV[3] (the mark "adoption under way"), only if the node has
// not renewed since the caller saw it dead. KEYS: nodes. ARGV: node,
// before_ms (its score must be below), mark. Returns 1 if changed.
var deadNodeScript = redis.NewScript(`
local s = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '')
if s and s < tonumber(ARGV[2]) then
  if ARGV[3] == 'forget' then
    redis.call('ZREM', KEYS[1], ARGV[1])
  else
    redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  end
  return 1
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

// dueScoresScript is dueScript returning id, score pairs: the score before
// the move (for leases: when the owner should have renewed by).
var dueScoresScript = redis.NewScript(`
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local later = tonumber(ARGV[3])
for i = 1, #ids, 2 do
  redis.call('ZADD', KEYS[1], 'XX', later, ids[i])
end
return ids
`)

// trimScript drops index entries older than ARGV[1] (unix ms) from the
// terminal-state indexes KEYS (their records have expired). The due poller
// runs it now and then, so transitions do not pay for it.
var trimScript = redis.NewScript(`
local n = 0
for _, k in ipairs(KEYS) do
  n = n + redis.call('ZREMRANGEBYSCORE', k, '-inf', ARGV[1])
end
return n
`)

// admitScript takes one of a tenant's concurrency slots for a job.
// KEYS: tenant active set. ARGV: job_id, limit, now_ms. Returns 1 if the
// job holds a slot (it already did, or one was free), 0 if the tenant is at
// its limit.
var admitScript = redis.NewScript(`
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  return 1
end
return 0
`)

// downgradeScript moves a SUCCEEDED job to OUTPUT_QUARANTINED — the one
// exit from a terminal state — only if it is still SUCCEEDED. A terminal job
// holds no lock; the compare-and-set on its state is the ownership check.
// KEYS: job, hist. ARGV: now_ms, reason, node, shard_tag, job_id, field,
// value, ... Returns {status, state}: OK or CONFLICT.
var downgradeScript = redis.NewScript(`
local st = redis.call('HGET', KEYS[1], 's')
if st ~= 'SUCCEEDED' then return {'CONFLICT', st or ''} end
local f = {'s', 'OUTPUT_QUARANTINED', 'updated', ARGV[1], 'reason', ARGV[2]}
for i = 6, #ARGV do f[#f + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('RPUSH', KEYS[2], ARGV[1] .. '|SUCCEEDED|OUTPUT_QUARANTINED|' .. ARGV[2] .. '|' .. ARGV[3])
redis.call('ZREM', ARGV[4] .. 'idx:SUCCEEDED', ARGV[5])
redis.call('ZADD', ARGV[4] .. 'idx:OUTPUT_QUARANTINED', ARGV[1], ARGV[5])
return {'OK', st}
`)

var allScripts = []*redis.Script{downgradeScript, admitScript, activateScript, transitionScript, releaseScript, renewScript,
	approveScript, claimScript, dueScript, dueScoresScript, trimScript, parkScript, renewManyScript, deadNodeScript}

// dlqAppendScript appends one DLQ entry to the stream unless its mark says
// it is there already: a DLQ entry leaves its job's outbox (Keys.DLQOutbox)
// at least once, and reaches the stream once; the stream's byte budget
// holds as for any entry (dlqAddScript). KEYS: dlq stream, mark (the
// stream's slot, see Keys.DLQMark). ARGV: mark_ttl_s, then dlqAddScript's
// (max entries, byte budget, entry bytes, field, value, ...). Returns 0 if
// the entry was there already. Sent with EVAL (a DLQ entry is rare), so no
// NOSCRIPT reply needs handling.
var dlqAppendScript = redis.NewScript(`
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[1]) then return 0 end
local A = {unpack(ARGV, 2)}
` + dlqAddLua)
