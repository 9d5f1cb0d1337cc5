-- admit: takes one of a tenant's concurrency slots for a job.
--
-- KEYS[1]  active_key  the tenant's active set (Keys.TenantActive)
-- ARGV[1]  job_id
-- ARGV[2]  limit       the tenant's number of slots
-- ARGV[3]  now_ms      the slot's score: when the job last asked for it
--
-- Returns 1 if the job holds a slot (it did already, or one was free), 0
-- if the tenant is at its limit. A job that holds its slot already has its
-- score moved to now: the repair of tenant slots frees a slot by its score's
-- age, and the job's actor times its dispatch from when it asked
-- (lifecycle.TenantSlotFresh).
local active_key = KEYS[1]
local job_id = ARGV[1]
local limit = tonumber(ARGV[2])
local now_ms = ARGV[3]

if redis.call('ZSCORE', active_key, job_id) then
  redis.call('ZADD', active_key, 'XX', now_ms, job_id)
  return 1
end
if redis.call('ZCARD', active_key) < limit then
  redis.call('ZADD', active_key, now_ms, job_id)
  return 1
end
return 0
