-- renew_many: renews many live locks of one shard in one call. Each lock,
-- and its job's lease, is extended only if the caller still holds the lock.
--
-- KEYS[1]      due_key         the shard's due set (Keys.Due), where a
--                              job's lease is member "|<job_id>"
--                              (Keys.LeaseMember)
-- KEYS[1 + i]  the i-th job's lock (Keys.Lock), for i = 1 .. n
-- ARGV[1]      ttl_ms          the locks' new time to live
-- ARGV[2]      lease_until_ms  the leases' new score: when the owner must
--                              have renewed by
-- ARGV[1 + 2i] the i-th job's id
-- ARGV[2 + 2i] the i-th job's lock value as the caller holds it
--
-- Returns, per job in order, 1 (renewed), 0 (another holder) or -1 (no
-- lock at all: it expired, or Redis lost its data).
local due_key = KEYS[1]
local ttl_ms = ARGV[1]
local lease_until_ms = ARGV[2]
local n = #KEYS - 1

local out = {}
for i = 1, n do
  local job_id = ARGV[1 + 2 * i]
  local lock_value = ARGV[2 + 2 * i]
  local cur = redis.call('GET', KEYS[1 + i])
  if cur == lock_value then
    redis.call('PEXPIRE', KEYS[1 + i], ttl_ms)
    redis.call('ZADD', due_key, lease_until_ms, '|' .. job_id)
    out[#out + 1] = 1
  elseif cur then
    out[#out + 1] = 0
  else
    out[#out + 1] = -1
  end
end
return out
