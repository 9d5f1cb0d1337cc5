-- renew: extends a job's lock, and moves the job's lease, only if the
-- caller still holds the lock. (The renewer uses renew_many.lua; this one
-- is loaded but no code calls it.)
--
-- KEYS[1]  lock_key        the job's lock (Keys.Lock)
-- KEYS[2]  leases_key      the job's shard's lease set (Keys.Leases)
-- ARGV[1]  lock_value      the caller's lock value, "<node>|<fence>"
-- ARGV[2]  ttl_ms          the lock's new time to live
-- ARGV[3]  job_id
-- ARGV[4]  lease_until_ms  the lease's new score: when the owner must have
--                          renewed by
--
-- Returns 1 if it renewed the lock, 0 if the caller no longer held it.
local lock_key = KEYS[1]
local leases_key = KEYS[2]
local lock_value = ARGV[1]
local ttl_ms = ARGV[2]
local job_id = ARGV[3]
local lease_until_ms = ARGV[4]

if redis.call('GET', lock_key) == lock_value then
  redis.call('ZADD', leases_key, lease_until_ms, job_id)
  return redis.call('PEXPIRE', lock_key, ttl_ms)
end
return 0
