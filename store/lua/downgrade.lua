-- downgrade: moves a SUCCEEDED job to OUTPUT_QUARANTINED, the one exit from
-- a terminal state, only if it is still SUCCEEDED. A terminal job holds no
-- lock; the compare-and-set on its state is the ownership check. The step
-- goes into the job's history, fields of its record (see lib/history.lua,
-- which runs in front of this); a record that an older version wrote
-- last has its list moved into the record (as in transition.lua).
--
-- KEYS[1]  job_key          the job's record, history included (Keys.Job)
-- KEYS[2]  legacy_hist_key  the list an older version kept the history in
--                           (Keys.LegacyHistory): read and deleted only
--                           for a record such a version wrote last
-- KEYS[3]  from_index_key   the shard's SUCCEEDED index (Keys.Index)
-- KEYS[4]  to_index_key     the shard's OUTPUT_QUARANTINED index
-- ARGV[1]  now_ms
-- ARGV[2]  reason
-- ARGV[3]  node
-- ARGV[4]  job_id
-- ARGV[5..] record fields to set: field, value, ...
--
-- Returns {status, state}: OK, or CONFLICT with the job's state ('' if it
-- has no record).
local job_key = KEYS[1]
local legacy_hist_key = KEYS[2]
local from_index_key = KEYS[3]
local to_index_key = KEYS[4]
local now_ms = ARGV[1]
local reason = ARGV[2]
local node = ARGV[3]
local job_id = ARGV[4]
local first_field = 5

local rec = redis.call('HMGET', job_key, 's', 'hn', 'updated', 'hu', 'hb', 'created', 'h0', 'hl')
local st = rec[1]
if st ~= 'SUCCEEDED' then return {'CONFLICT', st or ''} end
local base, write_base = historyBase(rec[5], rec[6], now_ms)
local hist = historyStart(rec[2], base, st, rec[7], rec[8])
-- An older version wrote the record last (see transition.lua).
local legacy = false
if rec[4] ~= rec[3] then
  local lines = redis.call('LRANGE', legacy_hist_key, 0, -1)
  if #lines > 0 then
    legacy = true
    historyAddLegacy(hist, lines)
  end
end
historyAdd(hist, now_ms, 'SUCCEEDED', 'OUTPUT_QUARANTINED', reason, node)
local f = {'s', 'OUTPUT_QUARANTINED', 'reason', reason}
historyCallerFields(f, ARGV, first_field)
local got = nil
local need = historyNeeds(hist)
if #need > 0 then
  got = redis.call('HMGET', job_key, unpack(need))
end
historyFields(f, hist, now_ms, write_base, got)
redis.call('HSET', job_key, unpack(f))
if legacy then
  redis.call('DEL', legacy_hist_key)
end
redis.call('ZREM', from_index_key, job_id)
redis.call('ZADD', to_index_key, now_ms, job_id)
return {'OK', st}
