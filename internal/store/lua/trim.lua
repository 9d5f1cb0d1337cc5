-- trim: drops the entries scored before before_ms from every sorted set in
-- KEYS: one shard's terminal-state indexes, whose records have expired by
-- then. The due poller runs it now and then, so transitions do not pay for
-- it.
--
-- KEYS[1..n]  the shard's terminal-state indexes (Keys.Index)
-- ARGV[1]     before_ms
--
-- Returns how many entries it dropped.
local before_ms = ARGV[1]

local n = 0
for i = 1, #KEYS do
  n = n + redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', before_ms)
end
return n
