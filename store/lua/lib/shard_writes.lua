-- shardWrites, shared by activate.lua and transition.lua, applies a
-- Transition's Adds and Sets in keys of the job's shard, each named by the
-- shard's tag followed by a suffix. From ARGV[a] on: m, then m × (key
-- suffix, score, member, trim_below, ttl_ms) to ZADD, then h, then h × (key
-- suffix, field, value, ttl_ms) to HSET. trim_below > 0 first drops the
-- sorted set's entries scored below it; ttl_ms > 0 then sets the key's
-- expiry. It returns the index of the first ARGV after them.
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
