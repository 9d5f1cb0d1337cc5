-- transition: moves a job along a path of states in one atomic step, only
-- if it is in one of the expected states and only while the caller's lock
-- value ("<node>|<fence>") is the current one. The shard's index, due and
-- lease keys are built here from the shard's tag (ARGV[5]).
--
-- KEYS: job, hist, lock
-- ARGV: lock_value, node, expected (comma-separated states), now_ms,
-- shard_tag, job_id, lock_after (keep|release|terminal), retention_s,
-- due_ms (0 keep, -1 clear, >0 set), n, then n pairs (to, reason), then the
-- shard writes (see lib/shard_writes.lua), then field, value, ...
--
-- Returns {status, state_before, ...}: see transitionScript in scripts.go.
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
