-- renew_many: renews many live locks of one shard in one call: each lock
-- (and its lease) is extended only if the caller still holds it. Each
-- lock's key is built here from the shard's tag (ARGV[3]).
--
-- KEYS: leases
-- ARGV: ttl_ms, lease_until_ms, shard_tag, then job_id, lock_value pairs.
--
-- Returns per pair 1 (renewed), 0 (another holder) or -1 (no lock at all:
-- it expired, or Redis lost its data).
local out = {}
for i = 4, #ARGV, 2 do
  local k = ARGV[3] .. 'lock:' .. ARGV[i]
  local cur = redis.call('GET', k)
  if cur == ARGV[i + 1] then
    redis.call('PEXPIRE', k, ARGV[1])
    redis.call('ZADD', KEYS[1], ARGV[2], ARGV[i])
    out[#out + 1] = 1
  elseif cur then
    out[#out + 1] = 0
  else
    out[#out + 1] = -1
  end
end
return out
