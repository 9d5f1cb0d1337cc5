-- activate: takes a job's lock and reports the job's state. When the job
-- does not exist and the caller asks for it, it creates the job and applies
-- the caller's plan (the first decision about the job, for example PENDING
-- → SCHEDULED → DISPATCHED to a chosen worker) in the same call, so the
-- happy path costs one script to create and dispatch and one to finish.
-- The plan's writes in the job's shard are made by shardWrites (see
-- lib/shard_writes.lua, which runs in front of this).
--
-- A job created terminal (or cancelled) is deleted, like every terminal
-- record, by the retention trim (trim.lua) through its index entry.
--
-- A created job with no due time of its own is due at rescue_at: every live
-- job has a due entry from its first moment, so a job whose actor or node
-- dies before it records a wait of its own is still woken by the due
-- poller.
--
-- A lock is "<node>|<fence>" with a TTL (renewed by its node), or
-- "<node>|<fence>|p" with none: a parked job's lock, held through its
-- node's lease (the node's alive key in the shard, Keys.Alive). A parked
-- lock of a node whose lease has expired is free: activating it adopts the
-- job. Any activation of a parked job takes it out of its node's parked set
-- and puts its deadline back in the due set. The node that parked the lock
-- is known only once the lock is read, so the caller names, in
-- parked_owner, the node whose alive key and parked set it passes (its own
-- node, unless a reply told it otherwise); when the lock turns out to be
-- parked by another node, the script changes nothing and answers
-- PARKED_BY, and the caller sends the call again naming that node.
--
-- KEYS[1]  job_key           the job's record (Keys.Job), its history
--                            included (see lib/hops.lua)
-- KEYS[2]  lock_key          the job's lock (Keys.Lock)
-- KEYS[3]  due_key           the shard's due set (Keys.Due); it holds
--                            the job's lease too, as member
--                            "|<job_id>" (Keys.LeaseMember)
-- KEYS[4]  index_key         the shard's index of the state the plan ends
--                            in (PENDING without hops) (Keys.Index)
-- KEYS[5]  mark_key          the job's cancel mark (Keys.CancelMark, see
--                            cancel_mark.lua)
-- KEYS[6]  leases_key        the shard's lease set of nodes of the
--                            version before (Keys.Leases): an old node's
--                            lease entry is dropped when this node adopts
--                            or ends the job here
-- KEYS[7]  owner_alive_key   parked_owner's lease in the shard (Keys.Alive)
-- KEYS[8]  owner_parked_key  parked_owner's parked set in the shard
--                            (Keys.Parked)
-- KEYS[9]  cancelled_key     the shard's index of CANCELLED (Keys.Index)
-- KEYS[10 ..]                the shard-write keys (see shardWrites)
--   A create sent with create = 3 or 4 (a new job's, the usual call) sends
--   KEYS[1 .. 5] only, then the shard-write keys from KEYS[6]: a new job
--   touches none of KEYS[6 .. 9], and each key sent costs Redis ~0.5-0.9
--   us to parse and hand to Lua. If the job turns out to have a record, a
--   lock or a cancel mark, such a call changes nothing and answers FULL:
--   the caller sends it again with every key (create = 1 or 2).
-- ARGV[1]  node              the activating node
-- ARGV[2]  now_ms
-- ARGV[3]  lock_ttl_ms
-- ARGV[4]  create            0 not to create a missing job; 1 to create
--                            it; 2 the same when a value of the record
--                            fields is "\0now" (see recordFields); 3 and 4
--                            as 1 and 2 with KEYS[1 .. 5] only (above)
-- ARGV[5]  job_id
-- ARGV[6]  request           the job request's bytes
-- ARGV[7]  lock_after        keep, release or terminal (after the plan)
-- ARGV[8]  due_ms            -1: none, > 0: this time (the caller puts
--                            the rescue time here for a plan with no
--                            due time of its own)
-- ARGV[9]  parked_owner      the node KEYS[6] and KEYS[7] belong to
-- ARGV[10] lease_at_ms       now_ms + 2 × lock_ttl_ms: the lease's score
--                            when the lock is taken (the caller adds, so
--                            that no number is parsed and formatted here)
-- ARGV[11] n                 the number of the plan's hops
-- ARGV[12 ..]                n × (to, reason), then the shard writes'
--                            arguments (see shardWrites), then record
--                            fields to set: field, value, ... (for a
--                            create, topic, tenant and trace among them,
--                            packed in field "pd" by the caller, first
--                            and in that order: the create cancelled by
--                            a mark, below, reads them from there)
--
-- A job created while a cancel mark for its tenant (or '*') exists is
-- created CANCELLED instead of with the plan (history PENDING submitted →
-- CANCELLED cancel_requested, the plan's submit time kept, its writes and
-- other fields left out, no lock, no due entry) and the mark is deleted.
--
-- Returns {status, state, fence, holder, field, value, ...} with status
-- FULL (create = 3 or 4 and the job is not new: nothing changed), CANCELLED (created cancelled by a mark; cancel_reason and cancelled_by
-- follow), CREATED (state = where the plan left it), ADOPTED (holder = the lock
-- value before, so the caller sees whether the job was parked; the
-- record's fields follow), BUSY (another node holds the lock; holder = its
-- value), TERMINAL (no lock taken), NOTFOUND, or PARKED_BY (another node
-- than parked_owner parked the lock, holder = its value; nothing changed).
-- A job that is terminal or missing loses its due entry and its lease:
-- nothing will ever wait for it.
local job_key = KEYS[1]
local lock_key = KEYS[2]
local due_key = KEYS[3]
local index_key = KEYS[4]
local mark_key = KEYS[5]
-- Not sent with create = 3 or 4: such a call answers FULL before any use.
local leases_key = KEYS[6]
local owner_alive_key = KEYS[7]
local owner_parked_key = KEYS[8]
local cancelled_key = KEYS[9]
local node = ARGV[1]
local now_ms = ARGV[2]
local lock_ttl_ms = ARGV[3]
local new_only = ARGV[4] == '3' or ARGV[4] == '4'
local create = ARGV[4] ~= '0'
-- plain: no record field is "\0now" (ARGV[4] 1 or 3): a usual plan goes
-- to HSET straight from ARGV, below.
local plain = ARGV[4] == '1' or ARGV[4] == '3'
local first_write_key = 10
if new_only then
  first_write_key = 6
end
local job_id = ARGV[5]
local request = ARGV[6]
local lock_after = ARGV[7]
local due_ms = ARGV[8]
local parked_owner = ARGV[9]
local lease_at_ms = ARGV[10]
local n = hopNumber(ARGV[11])
local first_hop = 12
local lease = '|' .. job_id

-- A submit's activation (create) usually finds nothing at all: no record,
-- no lock, no cancel mark. One EXISTS over the three says so, in place of
-- a GET, an HGET and an EXISTS; only when one of them exists are they read
-- one by one, below.
local fresh = create and redis.call('EXISTS', job_key, lock_key, mark_key) == 0
local cur, st
if not fresh then
  if new_only then
    return {'FULL', '', '0', ''}
  end
  cur = redis.call('GET', lock_key)
  st = redis.call('HGET', job_key, 's')
end
local terminal = st == 'SUCCEEDED' or st == 'FAILED' or st == 'TIMEOUT' or st == 'CANCELLED' or st == 'DENIED' or st == 'OUTPUT_QUARANTINED'
local parkedBy = nil
if cur then
  local owner = string.match(cur, '^[^|]*')
  if string.sub(cur, -2) == '|p' then
    -- A parked lock is held through its node's lease, not its own TTL.
    if owner ~= parked_owner then
      return {'PARKED_BY', st or '', '0', cur}
    end
    if owner ~= node and redis.call('EXISTS', owner_alive_key) == 1 then
      return {'BUSY', st or '', '0', cur}
    end
    parkedBy = owner
  elseif owner ~= node then
    return {'BUSY', st or '', '0', cur}
  end
end
if parkedBy then
  -- Unpark: the job leaves its owner's parked set, and its deadline goes
  -- back to the shard's due set, where every live wait is.
  redis.call('ZREM', owner_parked_key, job_id)
  local d = tonumber(redis.call('HGET', job_key, 'deadline') or '')
  if st and not terminal and d and d > 0 then
    redis.call('ZADD', due_key, d, job_id)
  end
  if not st or terminal then
    redis.call('DEL', lock_key)
  end
end
if not st then
  if not create then
    redis.call('ZREM', due_key, job_id, lease)
    redis.call('ZREM', leases_key, job_id)
    return {'NOTFOUND', '', '0', ''}
  end
  if not fresh and redis.call('EXISTS', mark_key) == 1 then
    -- The record fields follow the hops and the shard writes' arguments;
    -- topic, tenant and trace are the first three values packed in field
    -- pd ("<name>:<len>:<value>" each, store.packCreate), sent once.
    local a = first_hop + 2 * n
    a = a + 1 + 4 * tonumber(ARGV[a])
    a = a + 1 + 3 * tonumber(ARGV[a])
    local pd = ''
    for i = a, #ARGV - 1, 2 do
      if ARGV[i] == 'pd' then pd = ARGV[i + 1] end
    end
    local packed, at = {'', '', ''}, 1
    for j = 1, 3 do
      local c1 = string.find(pd, ':', at, true)
      local c2 = c1 and string.find(pd, ':', c1 + 1, true)
      if not c2 then break end
      local len = tonumber(string.sub(pd, c1 + 1, c2 - 1))
      packed[j] = string.sub(pd, c2 + 1, c2 + len)
      at = c2 + len + 1
    end
    local topic, tenant, trace_id = packed[1], packed[2], packed[3]
    local mark = redis.call('HGET', mark_key, tenant) or redis.call('HGET', mark_key, '*')
    redis.call('DEL', mark_key)
    if mark then
      -- The job is created CANCELLED, as a cancel mark asks (mark:
      -- "<by>\n<reason>"). Of the plan only the submit time is kept (field
      -- sub, among the record fields after the shard writes' arguments).
      -- (Inline, not a local function: a closure of the script's locals,
      -- made on every run, cost a few allocations a job.)
      local by, why = string.match(mark, '^([^\n]*)\n(.*)$')
      by, why = by or '', why or ''
      local f = {'s', 'CANCELLED', 'fence', 1, 'topic', topic, 'tenant', tenant, 'trace', trace_id, 'req', request,
        'created', now_ms, 'node', node, 'reason', 'cancel_requested', 'cancel_reason', why, 'cancelled_by', by}
      for i = a, #ARGV - 1, 2 do
        if ARGV[i] == 'sub' then
          f[#f + 1] = 'sub'
          f[#f + 1] = ARGV[i + 1]
        end
      end
      hopFields(f, #f, 0, '', now_ms, now_ms, node, {'PENDING', 'submitted', 'CANCELLED', 'cancel_requested'})
      redis.call('HSET', job_key, unpack(f))
      redis.call('ZADD', cancelled_key, now_ms, job_id)
      redis.call('ZREM', due_key, job_id, lease)
      -- Any lock left here is this node's own (another's answered BUSY above).
      redis.call('DEL', lock_key)
      redis.call('ZREM', leases_key, job_id)
      return {'CANCELLED', 'CANCELLED', '1', '', 'cancel_reason', why, 'cancelled_by', by}
    end
  end
  local prev, reason = 'PENDING', 'submitted'
  if n > 0 then
    prev, reason = ARGV[first_hop + 2 * n - 2], ARGV[first_hop + 2 * n - 1]
  end
  local first_field = shardWrites(first_write_key, first_hop + 2 * n)
  -- Every field a create writes costs Redis time: no "fence" (1 until an
  -- adoption counts it up, below), no "node" (the first hop's until an
  -- adoption writes it), and topic, tenant and trace come packed in one
  -- field among the caller's (store.ExpandRecord puts them back for
  -- readers).
  -- The usual plans (none, one hop, two: PENDING → SCHEDULED →
  -- DISPATCHED) go to HSET with the record fields straight from ARGV, the
  -- hops made in the call's arguments (lib/hops.lua's texts: offset 0,
  -- the node on the first only): no table to build and fill, no loop over
  -- the fields (issue 33: Lua's own work is a quarter of a job's Redis
  -- CPU). Others, and fields with a value "\0now", go through the table.
  if plain and n == 2 then
    redis.call('HSET', job_key, 's', prev, 'req', request, 'created', now_ms, 'reason', reason,
      'h1', '0|PENDING|submitted|' .. node, 'h2', '0|' .. ARGV[first_hop] .. '|' .. ARGV[first_hop + 1] .. '|',
      'h3', '0|' .. prev .. '|' .. reason .. '|', 'hn', '3', unpack(ARGV, first_field))
  elseif plain and n == 1 then
    redis.call('HSET', job_key, 's', prev, 'req', request, 'created', now_ms, 'reason', reason,
      'h1', '0|PENDING|submitted|' .. node, 'h2', '0|' .. prev .. '|' .. reason .. '|', 'hn', '2',
      unpack(ARGV, first_field))
  elseif plain and n == 0 then
    redis.call('HSET', job_key, 's', prev, 'req', request, 'created', now_ms, 'reason', reason,
      'h1', '0|PENDING|submitted|' .. node, 'hn', '1', unpack(ARGV, first_field))
  else
    -- Made at about its full size (a create writes ~40 words): a table
    -- grown one element at a time is rebuilt at 16, 32 and 64.
    local f = {'s', prev, 'req', request, 'created', now_ms, 'reason', reason,
      false, false, false, false, false, false, false, false, false, false, false, false, false, false, false, false,
      false, false, false, false, false, false, false, false, false, false, false, false, false, false, false, false,
      false, false, false, false, false, false, false, false}
    local k = recordFields(f, hopFields(f, 8, 0, '', now_ms, now_ms, node, submittedHop, first_hop, first_hop + 2 * n - 1),
      first_field)
    redis.call('HSET', job_key, unpack(f, 1, k))
  end
  redis.call('ZADD', index_key, now_ms, job_id)
  -- The job's due entry and its lease are members of one sorted set, so
  -- one ZADD writes both.
  local due = nil
  if lock_after ~= 'terminal' and due_ms ~= '-1' then
    due = due_ms
  end
  if lock_after == 'keep' then
    redis.call('SET', lock_key, node .. '|1', 'PX', lock_ttl_ms)
    if due then
      redis.call('ZADD', due_key, due, job_id, lease_at_ms, lease)
    else
      redis.call('ZADD', due_key, lease_at_ms, lease)
    end
  elseif due then
    redis.call('ZADD', due_key, due, job_id)
  end
  return {'CREATED', prev, '1', ''}
end
if terminal then
  redis.call('ZREM', due_key, job_id, lease)
  redis.call('ZREM', leases_key, job_id)
  return {'TERMINAL', st, '0', cur or ''}
end
local fence = redis.call('HINCRBY', job_key, 'fence', 1)
if fence == 1 then
  -- Created with no "fence" field: its creator held fence 1.
  fence = redis.call('HINCRBY', job_key, 'fence', 1)
end
redis.call('HSET', job_key, 'node', node)
redis.call('SET', lock_key, node .. '|' .. fence, 'PX', lock_ttl_ms)
redis.call('ZADD', due_key, lease_at_ms, lease)
redis.call('ZREM', leases_key, job_id)
local out = {'ADOPTED', st, tostring(fence), cur or ''}
local all = redis.call('HGETALL', job_key)
for i = 1, #all do out[#out + 1] = all[i] end
return out
