-- downgrade: moves a SUCCEEDED job to OUTPUT_QUARANTINED, the one exit from
-- a terminal state, only if it is still SUCCEEDED. A terminal job holds no
-- lock; the compare-and-set on its state is the ownership check. The hop
-- goes into the job's history, its record's fields (lib/hops.lua).
--
-- KEYS[1]  job_key         the job's record (Keys.Job)
-- KEYS[2]  from_index_key  the shard's SUCCEEDED index (Keys.Index)
-- KEYS[3]  to_index_key    the shard's OUTPUT_QUARANTINED index
-- ARGV[1]  now_ms
-- ARGV[2]  reason
-- ARGV[3]  node
-- ARGV[4]  job_id
-- ARGV[5..] record fields to set: field, value, ...
--
-- Returns {status, state}: OK, or CONFLICT with the job's state ('' if it
-- has no record).
local job_key = KEYS[1]
local from_index_key = KEYS[2]
local to_index_key = KEYS[3]
local now_ms = ARGV[1]
local reason = ARGV[2]
local node = ARGV[3]
local job_id = ARGV[4]
local first_field = 5

local rec = redis.call('HMGET', job_key, 's', 'hn', 'created', 'hl', 'h1')
local st = rec[1]
if st ~= 'SUCCEEDED' then return {'CONFLICT', st or ''} end
local f = {'s', 'OUTPUT_QUARANTINED', 'updated', now_ms, 'reason', reason}
hopFields(f, 6, tonumber(rec[2]) or 0, lastNode(rec[4], rec[5]), rec[3], now_ms, node, {'OUTPUT_QUARANTINED', reason})
for i = first_field, #ARGV do f[#f + 1] = ARGV[i] end
redis.call('HSET', job_key, unpack(f))
redis.call('ZREM', from_index_key, job_id)
redis.call('ZADD', to_index_key, now_ms, job_id)
return {'OK', st}
