-- due_scores: due.lua returning member, score pairs, with the score each
-- member had before the move (for a lease set: when the job's owner should
-- have renewed by).
--
-- KEYS[1]  set_key    the sorted set (Keys.Leases)
-- ARGV[1]  cutoff_ms
-- ARGV[2]  limit
-- ARGV[3]  later_ms   the members' new score
--
-- Returns member, score, member, score, ...
local set_key = KEYS[1]
local cutoff_ms = ARGV[1]
local limit = tonumber(ARGV[2])
local later_ms = tonumber(ARGV[3])

local ids = redis.call('ZRANGEBYSCORE', set_key, '-inf', cutoff_ms, 'WITHSCORES', 'LIMIT', 0, limit)
for i = 1, #ids, 2 do
  redis.call('ZADD', set_key, 'XX', later_ms, ids[i])
end
return ids
