-- due: returns up to limit members of a sorted set scored at or before
-- cutoff_ms (a shard's due set, or a node's parked set) and moves each to
-- later_ms, so a job whose wake-up did not take (its owner is alive and
-- will act itself) is offered again later, not at every tick. Leases
-- (members "|<job_id>", which a due set holds beside the due entries,
-- Keys.LeaseMember) are skipped and left where they are: due_scores.lua
-- reads them. At most 8 × limit members are looked at.
--
-- KEYS[1]  set_key    the sorted set (Keys.Due, Keys.Parked)
-- ARGV[1]  cutoff_ms
-- ARGV[2]  limit
-- ARGV[3]  later_ms   the members' new score
--
-- Returns the members (job ids).
local set_key = KEYS[1]
local cutoff_ms = ARGV[1]
local limit = tonumber(ARGV[2])
local later_ms = tonumber(ARGV[3])

local ids = {}
local off = 0
for _ = 1, 8 do
  local got = redis.call('ZRANGEBYSCORE', set_key, '-inf', cutoff_ms, 'LIMIT', off, limit)
  for _, id in ipairs(got) do
    if #ids < limit and string.byte(id, 1) ~= 124 then -- not '|': not a lease
      ids[#ids + 1] = id
    end
  end
  if #ids >= limit or #got < limit then break end
  off = off + #got
end
for _, id in ipairs(ids) do
  redis.call('ZADD', set_key, 'XX', later_ms, id)
end
return ids
