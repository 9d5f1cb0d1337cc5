-- dlqWrite, shared by dlq_add.lua and dlq_append.lua, appends one entry to
-- the DLQ stream, KEYS[1] in both, and keeps the stream within its byte
-- budget. Every entry records its own size ("bytes") and the running total
-- of sizes up to and including it ("cum", carried on from the newest
-- entry), so the bytes held from any entry to the newest are a
-- subtraction: dlqWrite drops (XTRIM MINID) the oldest entries until what
-- is left, newest included, fits the budget. An entry without "cum"
-- (written before the budget existed) counts as 0 and goes first once the
-- budget is spent. Each call looks at no more than 1,000 of the oldest
-- entries: a lowered budget is reached over a few calls, not in one long
-- one.
--
-- Its arguments: max_len (the stream's approximate MAXLEN), budget (bytes),
-- size (the entry's bytes) and first, the index in ARGV of the entry's
-- first field; the entry's field, value pairs run from there to the end of
-- ARGV. It returns the entry's stream id.
local function dlqWrite(max_len, budget, size, first)
  local function num(e, name)
    local f = e[2]
    for i = 1, #f, 2 do
      if f[i] == name then return tonumber(f[i+1]) or 0 end
    end
    return 0
  end
  local cum = size
  local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  if #last > 0 then cum = cum + num(last[1], 'cum') end
  local entry = {}
  for i = first, #ARGV do entry[#entry+1] = ARGV[i] end
  entry[#entry+1] = 'bytes'
  entry[#entry+1] = string.format('%d', size)
  entry[#entry+1] = 'cum'
  entry[#entry+1] = string.format('%d', cum)
  local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', max_len, '*', unpack(entry))
  local floor = cum - budget
  if floor <= 0 then return id end
  -- Keep the oldest entry whose running total exceeds floor, and all after it.
  local start = '-'
  for round = 1, 10 do
    local es = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', 100)
    for i, e in ipairs(es) do
      if num(e, 'cum') > floor then
        redis.call('XTRIM', KEYS[1], 'MINID', e[1])
        return id
      end
    end
    if #es < 100 then break end
    start = es[#es][1]
  end
  if start ~= '-' then redis.call('XTRIM', KEYS[1], 'MINID', start) end
  return id
end
