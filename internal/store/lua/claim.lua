-- claim: claims an idempotency key for a job, or names the job that holds
-- it already.
--
-- KEYS[1]  idem_key  the tenant's idempotency key (Keys.Idempotency)
-- ARGV[1]  job_id    the job that claims the key
-- ARGV[2]  ttl_s     how long a new claim is kept
--
-- Returns the id of the job that holds the key (job_id if this claimed it).
local idem_key = KEYS[1]
local job_id = ARGV[1]
local ttl_s = ARGV[2]

local v = redis.call('GET', idem_key)
if v then return v end
redis.call('SET', idem_key, job_id, 'EX', ttl_s)
return job_id
