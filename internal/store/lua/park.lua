-- park: parks a DISPATCHED or RUNNING job whose actor is about to stop. The
-- lock stays the caller's but loses its TTL and gains the "|p" mark: the
-- node's lease (the alive key) holds it from now on, not a per-job
-- renewal. The job's lease leaves the due set (nothing renews it), and so
-- does its due entry (another node's due poller must not wake it: it would
-- find the lock busy), and joins the node's parked set with its due time as score, where
-- the node's own poll finds it. The alive key is set if it is missing, so
-- a node never holds a parked lock without a lease: the renewer sets it at
-- start, but a job may park first.
--
-- KEYS[1]  lock_key     the job's lock (Keys.Lock)
-- KEYS[2]  leases_key   the job's shard's lease set of nodes of the
--                       version before (Keys.Leases)
-- KEYS[3]  parked_key   the node's parked set in the shard (Keys.Parked)
-- KEYS[4]  alive_key    the node's lease in the shard (Keys.Alive)
-- KEYS[5]  due_key      the shard's due set (Keys.Due), with the job's
--                       lease as member "|<job_id>" (Keys.LeaseMember)
-- ARGV[1]  lock_value   the caller's lock value, "<node>|<fence>"
-- ARGV[2]  job_id
-- ARGV[3]  due_ms       the job's score in the parked set
-- ARGV[4]  lease_ttl_ms the alive key's time to live, if this sets it
--
-- Returns 1 if it parked the job, 0 if the caller no longer held the lock.
local lock_key = KEYS[1]
local leases_key = KEYS[2]
local parked_key = KEYS[3]
local alive_key = KEYS[4]
local due_key = KEYS[5]
local lock_value = ARGV[1]
local job_id = ARGV[2]
local due_ms = ARGV[3]
local lease_ttl_ms = ARGV[4]

if redis.call('GET', lock_key) ~= lock_value then return 0 end
redis.call('SET', lock_key, lock_value .. '|p')
redis.call('ZREM', due_key, job_id, '|' .. job_id)
redis.call('ZREM', leases_key, job_id)
redis.call('ZADD', parked_key, due_ms, job_id)
redis.call('SET', alive_key, '1', 'PX', lease_ttl_ms, 'NX')
return 1
