-- renew_lease: extends a lease key only if owner holds it.
--
-- KEYS[1]  lease_key
-- ARGV[1]  owner      the owner's token
-- ARGV[2]  ttl_ms
--
-- Returns 1 if it extended the lease, 0 otherwise.
local lease_key = KEYS[1]
local owner = ARGV[1]
local ttl_ms = ARGV[2]

if redis.call('GET', lease_key) == owner then
  return redis.call('PEXPIRE', lease_key, ttl_ms)
end
return 0
