-- release_lease: deletes a lease key only if owner holds it.
--
-- KEYS[1]  lease_key
-- ARGV[1]  owner      the owner's token
--
-- Returns 1 if it deleted the lease, 0 otherwise.
local lease_key = KEYS[1]
local owner = ARGV[1]

if redis.call('GET', lease_key) == owner then
  return redis.call('DEL', lease_key)
end
return 0
