-- transition: moves a job along a path of states in one atomic step, only
-- if it is in one of the expected states and only while the caller's lock
-- value ("<node>|<fence>") is the current one. It records each hop in the
-- job's history (fields of the record, see lib/hops.lua), moves the job from its
-- state's index to the last hop's, sets its due time, gives the lock up
-- when asked (or when the job ends), and makes the Transition's writes in
-- the job's shard (see lib/shard_writes.lua, which runs in front of this).
-- A terminal job's record is deleted by the retention trim (trim.lua),
-- which finds it by its entry in the terminal state's index: no EXPIRE
-- here.
--
-- KEYS[1]  job_key       the job's record (Keys.Job)
-- KEYS[2]  lock_key      the job's lock (Keys.Lock)
-- KEYS[3]  due_key       the shard's due set (Keys.Due), which holds the
--                        job's lease too, as member "|<job_id>"
--                        (Keys.LeaseMember)
-- KEYS[4]  to_index_key  the shard's index of the last hop's state
--                        (Keys.Index)
-- KEYS[5 .. 4+e]         the shard's index of each expected state, in the
--                        order of ARGV[3] (e states)
-- KEYS[5+e ..]           the shard-write keys (see shardWrites)
-- ARGV[1]  lock_value    the caller's lock value
-- ARGV[2]  node
-- ARGV[3]  expected      the states the job may be in, comma-separated
-- ARGV[4]  now_ms
-- ARGV[5]  job_id
-- ARGV[6]  lock_after    keep, release or terminal
-- ARGV[7]  due_ms        0 keeps the due time, -1 clears it, > 0 sets it
-- ARGV[8]  landed        1 when a value of the record fields is "\0now"
--                        (see recordFields), else 0
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
local lock_key = KEYS[2]
local due_key = KEYS[3]
local to_index_key = KEYS[4]
local first_from_index = 5
local lock_value = ARGV[1]
local node = ARGV[2]
local expected = ARGV[3]
local now_ms = ARGV[4]
local job_id = ARGV[5]
local lock_after = ARGV[6]
local due_ms = ARGV[7]
local landed = ARGV[8]
local n = hopNumber(ARGV[9])
local first_hop = 10

local cur = redis.call('GET', lock_key)
if cur ~= lock_value then
  local rec = redis.call('HMGET', job_key, 'op', 's')
  return {'FENCED', cur or '', rec[1] or '', rec[2] or ''}
end
local rec = redis.call('HMGET', job_key, 's', 'hn', 'created', 'hl', 'h1')
local st = rec[1]
if not st then
  return {'NOTFOUND', ''}
end
-- from_index is the KEYS index of the job's state's index: the first
-- expected state equal to it.
local from_index = nil
local e = 0
if expected == st then
  -- One expected state, the job's (the usual case): no pattern to run.
  from_index, e = first_from_index, 1
else
  for state in string.gmatch(expected, '[^,]+') do
    e = e + 1
    if state == st and not from_index then from_index = first_from_index + e - 1 end
  end
end
if not from_index then
  return {'CONFLICT', st, redis.call('HGET', job_key, 'op') or ''}
end
local prev, reason = ARGV[first_hop + 2 * n - 2], ARGV[first_hop + 2 * n - 1]
local first_field = shardWrites(first_from_index + e, first_hop + 2 * n)
local hn = hopNumber(rec[2]) or 0
local last_node = lastNode(rec[4], rec[5])
if landed == '0' and node == last_node and (n == 1 or n == 2) and hopField[hn + 1] and hopField[hn + n] then
  -- The usual transition (one or two hops by the node of the job's last
  -- hop) goes to HSET with the record fields straight from ARGV: no
  -- table to build and fill, no loop over the fields (issue 33). The
  -- hops are lib/hops.lua's: no node named, no "hl".
  local delta = hopDelta(rec[3], now_ms)
  if n == 1 then
    redis.call('HSET', job_key, 's', prev, 'updated', now_ms, 'reason', reason,
      hopField[hn + 1], delta .. '|' .. prev .. '|' .. reason .. '|', 'hn', hopCount[hn + 1], unpack(ARGV, first_field))
  else
    redis.call('HSET', job_key, 's', prev, 'updated', now_ms, 'reason', reason,
      hopField[hn + 1], delta .. '|' .. ARGV[first_hop] .. '|' .. ARGV[first_hop + 1] .. '|',
      hopField[hn + 2], delta .. '|' .. prev .. '|' .. reason .. '|', 'hn', hopCount[hn + 2], unpack(ARGV, first_field))
  end
else
  -- Made at about its full size: a table grown one element at a time is
  -- rebuilt at 8, 16 and 32.
  local f = {'s', prev, 'updated', now_ms, 'reason', reason,
    false, false, false, false, false, false, false, false, false, false, false, false, false, false, false, false,
    false, false, false, false, false, false}
  local k = recordFields(f, hopFields(f, 6, hn, last_node, rec[3], now_ms, node, nil,
    first_hop, first_hop + 2 * n - 1), first_field)
  redis.call('HSET', job_key, unpack(f, 1, k))
end
if st ~= prev then
  redis.call('ZREM', KEYS[from_index], job_id)
end
redis.call('ZADD', to_index_key, now_ms, job_id)
-- The due entry and the lease are members of one set: a job that gives its
-- lock up and clears its due time drops both in one ZREM.
local unlock = lock_after == 'release' or lock_after == 'terminal'
if lock_after == 'terminal' or due_ms == '-1' then
  if unlock then
    redis.call('ZREM', due_key, job_id, '|' .. job_id)
  else
    redis.call('ZREM', due_key, job_id)
  end
else
  if due_ms ~= '0' then
    redis.call('ZADD', due_key, due_ms, job_id)
  end
  if unlock then
    redis.call('ZREM', due_key, '|' .. job_id)
  end
end
if unlock then
  redis.call('DEL', lock_key)
end
return {'OK', st}
