-- release: deletes a job's lock, and the job's lease, only if the caller
-- still holds the lock.
--
-- KEYS[1]  lock_key    the job's lock (Keys.Lock)
-- KEYS[2]  leases_key  the job's shard's lease set of nodes of the version
--                      before (Keys.Leases), where an old node's lease
--                      entry may be left
-- KEYS[3]  due_key     the job's shard's due set (Keys.Due), where the
--                      job's lease is member "|<job_id>" (Keys.LeaseMember)
-- ARGV[1]  lock_value  the caller's lock value, "<node>|<fence>"
-- ARGV[2]  job_id
--
-- Returns 1 if it released the lock, 0 if the caller no longer held it.
local lock_key = KEYS[1]
local leases_key = KEYS[2]
local due_key = KEYS[3]
local lock_value = ARGV[1]
local job_id = ARGV[2]

if redis.call('GET', lock_key) == lock_value then
  redis.call('ZREM', due_key, '|' .. job_id)
  redis.call('ZREM', leases_key, job_id)
  return redis.call('DEL', lock_key)
end
return 0
