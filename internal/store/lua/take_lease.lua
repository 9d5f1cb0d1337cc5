-- take_lease: makes owner the holder of a lease key (a leader lock, a
-- workflow lock) if nobody holds it, or extends it if owner holds it
-- already.
--
-- KEYS[1]  lease_key
-- ARGV[1]  owner      the owner's token
-- ARGV[2]  ttl_ms
--
-- Returns 1 if owner holds the lease now, 0 if another owner holds it.
local lease_key = KEYS[1]
local owner = ARGV[1]
local ttl_ms = ARGV[2]

local v = redis.call('GET', lease_key)
if not v then
  redis.call('SET', lease_key, owner, 'PX', ttl_ms)
  return 1
end
if v == owner then
  redis.call('PEXPIRE', lease_key, ttl_ms)
  return 1
end
return 0
