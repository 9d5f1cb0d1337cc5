-- shardWrites, shared by activate.lua and transition.lua, applies a
-- Transition's Adds and Sets: writes to keys of the job's shard (saga
-- records and triggers, the DLQ outbox) made in the same atomic step.
--
-- Its keys are KEYS[key_at] on: the m sorted-set keys, then the h hash
-- keys, in the order of their writes. Its arguments are ARGV[a] on: m,
-- then m × (score, member, trim_below, ttl_ms) to ZADD, then h, then
-- h × (field, value, ttl_ms) to HSET. trim_below > 0 first drops the sorted
-- set's entries scored below it; ttl_ms > 0 then sets the key's expiry.
-- It returns the index of the first ARGV after them.
local function shardWrites(key_at, a)
  -- Most transitions have no writes here: their counts, '0', are not
  -- parsed (a tonumber is a strtod).
  local m = 0
  if ARGV[a] ~= '0' then m = tonumber(ARGV[a]) end
  for i = 0, m - 1 do
    local b = a + 1 + 4 * i
    local score, member, trim_below, ttl_ms = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
    if tonumber(trim_below) > 0 then
      redis.call('ZREMRANGEBYSCORE', KEYS[key_at + i], '-inf', '(' .. trim_below)
    end
    redis.call('ZADD', KEYS[key_at + i], score, member)
    if tonumber(ttl_ms) > 0 then
      redis.call('PEXPIRE', KEYS[key_at + i], ttl_ms)
    end
  end
  a = a + 1 + 4 * m
  local h = 0
  if ARGV[a] ~= '0' then h = tonumber(ARGV[a]) end
  for i = 0, h - 1 do
    local b = a + 1 + 3 * i
    local field, value, ttl_ms = ARGV[b], ARGV[b + 1], ARGV[b + 2]
    redis.call('HSET', KEYS[key_at + m + i], field, value)
    if tonumber(ttl_ms) > 0 then
      redis.call('PEXPIRE', KEYS[key_at + m + i], ttl_ms)
    end
  end
  return a + 1 + 3 * h
end
