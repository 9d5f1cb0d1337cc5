-- approve: records a human decision on a job that waits for one, and makes
-- the job due now so a replica wakes it.
--
-- KEYS[1]  job_key   the job's record (Keys.Job)
-- KEYS[2]  due_key   the job's shard's due set (Keys.Due)
-- ARGV[1]  decision  approved or rejected
-- ARGV[2]  by        who decided
-- ARGV[3]  reason
-- ARGV[4]  hash      the job hash the approver saw ('' for any)
-- ARGV[5]  now_ms
-- ARGV[6]  job_id
--
-- Returns {status, detail}: OK (detail = the stored hash), NOTFOUND, STATE
-- (the job is not APPROVAL_REQUIRED; detail = its state), DECIDED (a
-- decision is recorded already; detail = it), NOHASH (the job has no hash
-- to approve) or HASH (the hash differs; detail = the stored hash).
--
-- The first decision stands: the job stays APPROVAL_REQUIRED until a due
-- poller wakes it (a second or two), and a later call overwrote a reject
-- with an approve in that window.
local job_key = KEYS[1]
local due_key = KEYS[2]
local decision = ARGV[1]
local by = ARGV[2]
local reason = ARGV[3]
local hash = ARGV[4]
local now_ms = ARGV[5]
local job_id = ARGV[6]

local st = redis.call('HGET', job_key, 's')
if not st then return {'NOTFOUND', ''} end
if st ~= 'APPROVAL_REQUIRED' then return {'STATE', st} end
local prior = redis.call('HGET', job_key, 'approval_decision')
if prior and prior ~= '' then return {'DECIDED', prior} end
local h = redis.call('HGET', job_key, 'job_hash') or ''
if h == '' then return {'NOHASH', ''} end
if hash ~= '' and hash ~= h then return {'HASH', h} end
redis.call('HSET', job_key, 'approval_decision', decision, 'approval_by', by,
  'approval_reason', reason, 'approval_hash', h, 'approval_at', now_ms)
redis.call('ZADD', due_key, now_ms, job_id)
return {'OK', h}
