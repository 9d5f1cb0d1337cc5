-- transition: moves a job along a path of states in one atomic step, only
-- if it is in one of the expected states and only while the caller's lock
-- value ("<node>|<fence>") is the current one. It records each hop in the
-- job's history, fields of its record (see lib/history.lua, which runs in
-- front of this), moves the job from its state's index to the last hop's,
-- sets its due time, gives the lock up when asked (or when the job ends,
-- which also starts the retention clock), and makes the Transition's
-- writes in the job's shard (see lib/shard_writes.lua, which runs in front
-- of this too).
--
-- A record that an older version wrote last has (some of) its history in
-- a list (Keys.LegacyHistory): the next write moves the list's entries into
-- the record and deletes the list (see lib/history.lua).
--
-- KEYS[1]  job_key          the job's record, history included (Keys.Job)
-- KEYS[2]  legacy_hist_key  the list an older version kept the history in
--                           (Keys.LegacyHistory): read and deleted only
--                           for a record such a version wrote last
-- KEYS[3]  lock_key         the job's lock (Keys.Lock)
-- KEYS[4]  due_key          the shard's due set (Keys.Due)
-- KEYS[5]  leases_key       the shard's lease set (Keys.Leases)
-- KEYS[6]  to_index_key     the shard's index of the last hop's state
--                           (Keys.Index)
-- KEYS[7 .. 6+e]            the shard's index of each expected state, in
--                           the order of ARGV[3] (e states)
-- KEYS[7+e ..]              the shard-write keys (see shardWrites)
-- ARGV[1]  lock_value    the caller's lock value
-- ARGV[2]  node
-- ARGV[3]  expected      the states the job may be in, comma-separated
-- ARGV[4]  now_ms
-- ARGV[5]  job_id
-- ARGV[6]  lock_after    keep, release or terminal
-- ARGV[7]  retention_s   how long a terminal job's record is kept (0: for
--                        ever)
-- ARGV[8]  due_ms        0 keeps the due time, -1 clears it, > 0 sets it
-- ARGV[9]  n             the number of hops (at least 1)
-- ARGV[10 ..]            n × (to, reason), then the shard writes' arguments
--                        (see shardWrites), then record fields to set:
--                        field, value, ...
--
-- Returns {status, state_before} with status OK, FENCED (the lock's value
-- differs: this owner is stale; state_before is then the lock's value, and
-- the record's "op" field and state follow), NOTFOUND, or CONFLICT (the
-- state is not expected; then a third element: the record's "op" field,
-- the identity of the write that put it there, see Transition.Op). The
-- "op" field tells a retried write whether its first try applied: a write
-- that released the lock (a terminal one) is FENCED when tried again.
local job_key = KEYS[1]
local legacy_hist_key = KEYS[2]
local lock_key = KEYS[3]
local due_key = KEYS[4]
local leases_key = KEYS[5]
local to_index_key = KEYS[6]
local first_from_index = 7
local lock_value = ARGV[1]
local node = ARGV[2]
local expected = ARGV[3]
local now_ms = ARGV[4]
local job_id = ARGV[5]
local lock_after = ARGV[6]
local retention_s = ARGV[7]
local due_ms = ARGV[8]
local n = tonumber(ARGV[9])
local first_hop = 10

local cur = redis.call('GET', lock_key)
if cur ~= lock_value then
  local rec = redis.call('HMGET', job_key, 'op', 's')
  return {'FENCED', cur or '', rec[1] or '', rec[2] or ''}
end
local rec = redis.call('HMGET', job_key, 's', 'hn', 'op', 'updated', 'hu', 'hb', 'created', 'h0', 'hl')
local st = rec[1]
if not st then
  return {'NOTFOUND', ''}
end
-- from_index is the KEYS index of the job's state's index: the first
-- expected state equal to it.
local from_index = nil
local e = 0
for state in string.gmatch(expected, '[^,]+') do
  e = e + 1
  if state == st and not from_index then from_index = first_from_index + e - 1 end
end
if not from_index then
  return {'CONFLICT', st, rec[3] or ''}
end
local base, write_base = historyBase(rec[6], rec[7], now_ms)
local hist = historyStart(rec[2], base, st, rec[8], rec[9])
-- An older version wrote the record last: its list holds what the fields
-- lack. This (with KEYS[2]) can go once no node runs such a version and no
-- record it wrote remains (see Store.GetJob).
local legacy = false
if rec[5] ~= rec[4] then
  local lines = redis.call('LRANGE', legacy_hist_key, 0, -1)
  if #lines > 0 then
    legacy = true
    historyAddLegacy(hist, lines)
  end
end
local prev, reason = st, ''
for i = 1, n do
  local to = ARGV[first_hop + 2 * (i - 1)]
  reason = ARGV[first_hop + 2 * (i - 1) + 1]
  historyAdd(hist, now_ms, prev, to, reason, node)
  prev = to
end
local first_field = shardWrites(first_from_index + e, first_hop + 2 * n)
local f = {'s', prev, 'reason', reason}
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
if st ~= prev then
  redis.call('ZREM', KEYS[from_index], job_id)
end
redis.call('ZADD', to_index_key, now_ms, job_id)
if lock_after == 'terminal' or due_ms == '-1' then
  redis.call('ZREM', due_key, job_id)
elseif due_ms ~= '0' then
  redis.call('ZADD', due_key, due_ms, job_id)
end
if lock_after == 'release' then
  redis.call('DEL', lock_key)
  redis.call('ZREM', leases_key, job_id)
elseif lock_after == 'terminal' then
  redis.call('DEL', lock_key)
  redis.call('ZREM', leases_key, job_id)
  local keep = tonumber(retention_s)
  if keep > 0 then
    redis.call('EXPIRE', job_key, keep)
  end
end
return {'OK', st}
