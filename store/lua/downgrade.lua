-- downgrade: moves a SUCCEEDED job to OUTPUT_QUARANTINED, the one exit from
-- a terminal state, only if it is still SUCCEEDED. A terminal job holds no
-- lock; the compare-and-set on its state is the ownership check. The
-- shard's index keys are built here from the shard's tag (ARGV[4]).
--
-- KEYS: job, hist
-- ARGV: now_ms, reason, node, shard_tag, job_id, field, value, ...
--
-- Returns {status, state}: OK or CONFLICT.
local st = redis.call('HGET', KEYS[1], 's')
if st ~= 'SUCCEEDED' then return {'CONFLICT', st or ''} end
local f = {'s', 'OUTPUT_QUARANTINED', 'updated', ARGV[1], 'reason', ARGV[2]}
for i = 6, #ARGV do f[#f + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('RPUSH', KEYS[2], ARGV[1] .. '|SUCCEEDED|OUTPUT_QUARANTINED|' .. ARGV[2] .. '|' .. ARGV[3])
redis.call('ZREM', ARGV[4] .. 'idx:SUCCEEDED', ARGV[5])
redis.call('ZADD', ARGV[4] .. 'idx:OUTPUT_QUARANTINED', ARGV[1], ARGV[5])
return {'OK', st}
