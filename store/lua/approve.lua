-- approve: records a human decision on a job that waits for one, and makes
-- the job due now so a replica wakes it. The shard's due key is built here
-- from the shard's tag (ARGV[6]).
--
-- KEYS: job
-- ARGV: decision (approved|rejected), by, reason, hash, now_ms, shard_tag,
-- job_id
--
-- Returns {status, detail}: OK, NOTFOUND, STATE (not APPROVAL_REQUIRED;
-- detail = state), HASH (hash differs; detail = stored hash).
local st = redis.call('HGET', KEYS[1], 's')
if not st then return {'NOTFOUND', ''} end
if st ~= 'APPROVAL_REQUIRED' then return {'STATE', st} end
local h = redis.call('HGET', KEYS[1], 'job_hash') or ''
if ARGV[4] ~= '' and ARGV[4] ~= h then return {'HASH', h} end
redis.call('HSET', KEYS[1], 'approval_decision', ARGV[1], 'approval_by', ARGV[2],
  'approval_reason', ARGV[3], 'approval_hash', h, 'approval_at', ARGV[5])
redis.call('ZADD', ARGV[6] .. 'due', ARGV[5], ARGV[7])
return {'OK', h}
