-- hopFields, shared by activate.lua, transition.lua and downgrade.lua,
-- records a job's transitions as fields of its record rather than in a list
-- of their own: a key per job costs Redis more than the commands on it (to
-- create, expire and delete it; a history list would be about a fifth of a
-- job's Redis time). Field "hn" is the number of hops; hop i is field
-- "h<i>" = "<ms after the record's created>|<to>|<reason>|<node>", where
-- node is empty when it is the previous hop's node (field "hl"; a record
-- without "hl" has had hops by its first hop's node only, so a new record
-- does not repeat that node in a field of its own: see lastNode) and the
-- state a hop leaves is the previous hop's "to" ("" for the first). The
-- fields stay short, so a record keeps Redis's compact hash encoding
-- (values up to hash-max-listpack-value, 64 bytes by default). The ms may
-- be negative when the writer's clock is behind the creator's.
--
-- It reads no KEYS or ARGV of its own. Its arguments: f, the field, value
-- list of the record's next HSET, which gets the hop fields appended after
-- its k-th element (it returns the index of the last one it wrote); hn,
-- last_node and created_ms as the record holds them (hn 0 and last_node ''
-- for a new job); now_ms and node, the writer's; and the hops: those of
-- the flat list hops (to, reason, to, reason, ...; or nil), then those of
-- ARGV[a .. b] (a and b may be nil), so that a caller's hops are not copied
-- into a table of their own.

-- hopField and hopCount are the names "h<i>" and the counts "<i>" of a
-- record's first hops, as the strings the record holds: a number handed to
-- redis.call or joined to a string is formatted by printf, and a job's two
-- writes did so about eight times (issue 33: ~4 % of Redis's CPU went to
-- formatting and parsing numbers). Past the tables' end the number is
-- formatted as before.
local hopField = {'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'h7', 'h8', 'h9', 'h10', 'h11', 'h12'}
local hopCount = {'1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12'}

-- hopNumber is the other way round: the number of a count's string (a
-- record's "hn", a caller's hop count), matched for the usual counts where
-- tonumber would run strtod (~110 ns in Redis's Lua; the match ~30-60 ns,
-- and no table to build on every call, which would cost more than it
-- saves in a call of one job).
local function hopNumber(s)
  if s == '1' then return 1 elseif s == '2' then return 2 elseif s == '3' then return 3
  elseif s == '4' then return 4 elseif s == '5' then return 5 elseif s == '0' then return 0 end
  return tonumber(s)
end

local formatNumber = string.format

-- hopDelta is a hop's offset, the text of now_ms - created_ms.
local function hopDelta(created_ms, now_ms)
  if created_ms == now_ms then
    return '0'
  end
  local d = tonumber(now_ms) - (tonumber(created_ms) or 0)
  if d % 1 == 0 and d > -1e14 and d < 1e14 then
    -- The text tostring's '%.14g' gives a whole number of fewer than
    -- 15 digits, at about half its cost (integer formatting, not
    -- floating point).
    return formatNumber('%d', d)
  end
  return tostring(d)
end

local function hopFields(f, k, hn, last_node, created_ms, now_ms, node, hops, a, b)
  local first = hn == 0
  local delta = hopDelta(created_ms, now_ms)
  local who = node
  if node == last_node then who = '' end
  if hops then
    for i = 1, #hops, 2 do
      hn = hn + 1
      f[k + 1] = hopField[hn] or ('h' .. hn)
      f[k + 2] = delta .. '|' .. hops[i] .. '|' .. hops[i + 1] .. '|' .. who
      k = k + 2
      who = ''
    end
  end
  for i = a or 1, b or 0, 2 do
    hn = hn + 1
    f[k + 1] = hopField[hn] or ('h' .. hn)
    f[k + 2] = delta .. '|' .. ARGV[i] .. '|' .. ARGV[i + 1] .. '|' .. who
    k = k + 2
    who = ''
  end
  f[k + 1] = 'hn'
  f[k + 2] = hopCount[hn] or tostring(hn)
  k = k + 2
  if node ~= last_node and not first then
    f[k + 1] = 'hl'
    f[k + 2] = node
    k = k + 2
  end
  return k
end

-- submittedHop is a new job's first hop, which no caller sends.
local submittedHop = {'PENDING', 'submitted'}

-- lastNode is the node of a record's last hop, from its fields "hl" and
-- "h1" (nil, nil for a record with no hops: '').
local function lastNode(hl, h1)
  if hl then return hl end
  if h1 then return string.match(h1, '[^|]*$') end
  return ''
end

-- recordFields appends the caller's record fields, ARGV[first ..] as field,
-- value pairs, to f after its k-th element, and returns the index of the
-- last. A value "\0now" (jobstate.LandedNow) becomes when the
-- write lands, on Redis's clock (TIME, unix ms): a dispatch on a slot
-- records it (lifecycle's adoptedSlotStale reads it).
local function recordFields(f, k, first)
  for i = first, #ARGV, 2 do
    local v = ARGV[i + 1]
    if v == '\0now' then
      local t = redis.call('TIME')
      v = tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    end
    f[k + 1] = ARGV[i]
    f[k + 2] = v
    k = k + 2
  end
  return k
end
