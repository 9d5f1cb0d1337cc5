-- due_scores: the expired leases of a shard (the jobs whose owner stopped
-- renewing before cutoff_ms), with the score each had before this moves it
-- to later_ms (when the job's owner should have renewed by), so a job is
-- offered again only if nobody adopts it. A lease is member "|<job_id>" of
-- the shard's due set (Keys.LeaseMember), or, written by a node of the
-- version before, member "<job_id>" of the shard's lease set (Keys.Leases),
-- read after the due set's. At most 8 × limit due-set members are looked
-- at.
--
-- KEYS[1]  due_key     the shard's due set (Keys.Due)
-- KEYS[2]  leases_key  the shard's lease set of nodes of the version
--                      before (Keys.Leases)
-- ARGV[1]  cutoff_ms
-- ARGV[2]  limit
-- ARGV[3]  later_ms   the members' new score
--
-- Returns job id, score, job id, score, ... (up to limit jobs).
local due_key = KEYS[1]
local leases_key = KEYS[2]
local cutoff_ms = ARGV[1]
local limit = tonumber(ARGV[2])
local later_ms = tonumber(ARGV[3])

local out, moved = {}, {}
local off = 0
for _ = 1, 8 do
  local got = redis.call('ZRANGEBYSCORE', due_key, '-inf', cutoff_ms, 'WITHSCORES', 'LIMIT', off, limit)
  for i = 1, #got, 2 do
    if #moved < limit and string.byte(got[i], 1) == 124 then -- '|': a lease
      moved[#moved + 1] = got[i]
      out[#out + 1] = string.sub(got[i], 2)
      out[#out + 1] = got[i + 1]
    end
  end
  if #moved >= limit or #got < 2 * limit then break end
  off = off + #got / 2
end
for _, m in ipairs(moved) do
  redis.call('ZADD', due_key, 'XX', later_ms, m)
end
if #moved < limit then
  local old = redis.call('ZRANGEBYSCORE', leases_key, '-inf', cutoff_ms, 'WITHSCORES', 'LIMIT', 0, limit - #moved)
  for i = 1, #old, 2 do
    redis.call('ZADD', leases_key, 'XX', later_ms, old[i])
    out[#out + 1] = old[i]
    out[#out + 1] = old[i + 1]
  end
end
return out
