-- activate: takes a job's lock and reports the job's state. When the job
-- does not exist and the caller asks for it, it creates the job and applies
-- the caller's plan (the first decision about the job, for example PENDING
-- → SCHEDULED → DISPATCHED to a chosen worker) in the same call. The
-- shard's index, due, lease, parked and alive keys are built here from the
-- shard's tag (ARGV[5]); they carry the same hash tag as the job's keys.
--
-- KEYS: job, hist, lock
-- ARGV: node, now_ms, lock_ttl_ms, create(0|1), shard_tag, job_id, topic,
-- tenant, trace_id, request(bytes), rescue_at_ms, lock_after
-- (keep|release|terminal), due_ms (0 = rescue_at, -1 none, >0 set),
-- retention_s, n, then n pairs (to, reason), then the shard writes (see
-- lib/shard_writes.lua), then field, value, ...
--
-- Returns {status, state, fence, holder, field, value, ...}: see
-- activateScript in scripts.go.
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
