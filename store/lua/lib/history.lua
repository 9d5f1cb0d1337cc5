-- history, shared by activate.lua, transition.lua and downgrade.lua, keeps
-- a job's history in fields of its record (Keys.Job), one field per entry,
-- each value short enough (Redis's hash-max-listpack-value, 64 bytes) that
-- a small record stays a listpack:
--
--   h<slot>  one entry: "dt|to|reason", "dt|to|reason|node" or
--            "dt|to|reason|node|from". dt is the entry's time in ms less the
--            history's base (the record's "created", or hb). The node is
--            written when it differs from the previous entry's (always on
--            entry 0, and on entry HIST_HEAD, where the ring starts);
--            otherwise it is the previous entry's. The from state is
--            written when it is not the previous entry's to state (entry
--            0's previous to state is ''), and then the node is too.
--   hn       how many entries the job has had (not how many are kept).
--   hu       the record's "updated" time as of the last write of the
--            history.
--   hl       the last entry's node, when it differs from entry 0's (a
--            writer compares its node with it; readers need not read it).
--   hb       the history's base time, written only when the record has no
--            numeric "created" at the first write of this version.
--   hx       once entries have been dropped (see below): "dt|to|node" or
--            "dt|to|node|from", the first dropped entry's dt (and its from
--            state, when its entry wrote one), and the last dropped entry's
--            to state and node, which the oldest kept entry takes as its
--            previous entry's.
--
-- Entry i (from 0) lives in field h<i> for i < HIST_HEAD, and in the ring
-- h<HIST_HEAD + (i - HIST_HEAD) mod HIST_TAIL> after that: the first
-- HIST_HEAD entries stay, and each later entry overwrites the one HIST_TAIL
-- entries before it. Past HIST_HEAD + HIST_TAIL entries a history thus
-- keeps the first HIST_HEAD and the latest HIST_TAIL, and hn less
-- HIST_HEAD + HIST_TAIL were dropped. No field is ever deleted. Readers
-- (store.ParseHistory) order the ring by hn. store.HistoryHead and
-- store.HistoryTail are the same numbers on the Go side.
--
-- A script reads hn, hu, hb, h0, hl and "created" with the record's state
-- (one HMGET) and adds the new entries' fields, hn, hu and "updated" to
-- the HSET it makes anyway, after the caller's fields (historyFields), so
-- recording a transition costs no command of its own. Only a write that
-- drops entries reads more: the dropped entries' fields and hx
-- (historyNeeds), in one more HMGET. These functions call no command: they
-- take no KEYS and read no ARGV.
--
-- Older versions kept the history in a list (Keys.LegacyHistory) and wrote
-- none of these fields, but set "updated" as these scripts do. So a record
-- whose hu differs from its "updated" (hu absent included) was last written
-- by an older version, and its list holds the entries the fields lack: the
-- script that writes the record next appends the list's entries and then
-- its own, and deletes the list (see transition.lua).
local HIST_HEAD = 16
local HIST_TAIL = 240

-- historyClean returns s with every '|' and newline replaced by '_'. Node
-- ids (letters, digits and _ - . :) and reasons (core's codes) contain
-- neither; this only keeps a bad value from breaking its entry.
local function historyClean(s)
  if string.find(s, '[|\n]') then
    return (string.gsub(s, '[|\n]', '_'))
  end
  return s
end

-- historySlot returns the field that holds entry i (from 0).
local function historySlot(i)
  if i < HIST_HEAD then
    return 'h' .. i
  end
  return 'h' .. (HIST_HEAD + (i - HIST_HEAD) % HIST_TAIL)
end

-- historyOwns reports whether field is one of the history's fields, which
-- the caller's fields may not set and an adoption's reply leaves out.
local function historyOwns(field)
  return field == 'hn' or field == 'hu' or field == 'hl' or field == 'hb' or field == 'hx' or
    string.find(field, '^h%d+$') ~= nil
end

-- historySplit returns the '|'-separated parts of v.
local function historySplit(v)
  local p = {}
  for s in string.gmatch(v .. '|', '([^|]*)|') do p[#p + 1] = s end
  return p
end

-- historyStart returns a history to append to, from the record's fields
-- as HMGET gave them (false when absent): hn (the entries so far), h0 and
-- hl (whose nodes tell the last entry's). Times are relative to base (a
-- number); prev_to is the last entry's to state (the record's state).
local function historyStart(hn, base, prev_to, h0, hl)
  local hist = {c = tonumber(hn) or 0, base = base, prev_to = prev_to, prev_node = false, h0_node = false,
    add = {}}
  if hist.c == 0 then
    hist.prev_to = ''
  else
    if h0 then hist.h0_node = historySplit(h0)[4] or false end
    hist.prev_node = hl or hist.h0_node
  end
  hist.last_node = hist.prev_node
  return hist
end

-- historyBase returns the base time of a record's history from its hb and
-- "created" fields (as HMGET gave them), or now_ms and true when the
-- record has neither as a number (the caller then writes hb).
local function historyBase(hb, created, now_ms)
  local b = tonumber(hb) or tonumber(created)
  if b then return b, false end
  return tonumber(now_ms), true
end

-- historyAdd appends one entry, at ms (unix ms; the base when it is not a
-- number), to hist.
local function historyAdd(hist, ms, from, to, reason, node)
  from, to, reason, node = historyClean(from), historyClean(to), historyClean(reason), historyClean(node)
  local i = hist.c + #hist.add
  local v = string.format('%d', (tonumber(ms) or hist.base) - hist.base) .. '|' .. to .. '|' .. reason
  if from ~= hist.prev_to then
    v = v .. '|' .. node .. '|' .. from
  elseif node ~= hist.prev_node or i == HIST_HEAD then
    v = v .. '|' .. node
  end
  hist.add[#hist.add + 1] = v
  hist.prev_to, hist.prev_node = to, node
  if i == 0 then hist.h0_node = node end
end

-- historyAddLegacy appends the entries of an older version's list
-- ("unix_ms|from|to|reason|node", oldest first) to hist, skipping any that
-- does not parse. Their first entry's from state and node are written
-- out: the writer does not know the previous entry's.
local function historyAddLegacy(hist, lines)
  hist.prev_to, hist.prev_node = false, false
  if hist.c + #hist.add == 0 then hist.prev_to = '' end
  for _, line in ipairs(lines) do
    local ms, from, to, reason, node = string.match(line, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
    if ms then
      historyAdd(hist, ms, from, to, reason, node)
    end
  end
end

-- historyDropped returns the first and last index of the entries that the
-- appends of hist drop from the ring (nil when none).
local function historyDropped(hist)
  local n = hist.c + #hist.add
  if n <= HIST_HEAD + HIST_TAIL then return nil end
  return math.max(HIST_HEAD, hist.c - HIST_TAIL), n - HIST_TAIL - 1
end

-- historyNeeds returns the fields a write that drops entries reads before
-- historyFields: the dropped entries' that exist already, then hx. It is
-- empty when the write drops none.
local function historyNeeds(hist)
  local first, last = historyDropped(hist)
  if not first then return {} end
  local out = {}
  for i = first, math.min(last, hist.c - 1) do
    out[#out + 1] = historySlot(i)
  end
  out[#out + 1] = 'hx'
  return out
end

-- historyDrop returns hx after the appends of hist, from the values of the
-- fields historyNeeds named (got, as HMGET gave them): it walks the
-- entries this write drops, oldest first, from the previous hx.
local function historyDrop(hist, got)
  local first, last = historyDropped(hist)
  local dt0, to, node, from0 = '', '', '', nil
  if got[#got] then
    local p = historySplit(got[#got])
    dt0, to, node, from0 = p[1], p[2] or '', p[3] or '', p[4]
  end
  for i = first, last do
    local v
    if i < hist.c then
      v = got[i - first + 1]
    else
      v = hist.add[i - hist.c + 1]
    end
    if v then
      local p = historySplit(v)
      if i == HIST_HEAD then dt0, from0 = p[1], p[5] end
      to = p[2] or to
      node = p[4] or node
    end
  end
  local out = dt0 .. '|' .. to .. '|' .. node
  if from0 then out = out .. '|' .. from0 end
  return out
end

-- historyFields appends to f, the field-value list of the record's HSET
-- for a write at now_ms, the kept entries of hist's appends, hn, hu,
-- "updated", hl when the last entry's node changed, hb when write_base, and
-- hx when got (the values of historyNeeds' fields) is given.
local function historyFields(f, hist, now_ms, write_base, got)
  local n = hist.c + #hist.add
  for j, v in ipairs(hist.add) do
    local i = hist.c + j - 1
    if i < HIST_HEAD or i >= n - HIST_TAIL then
      f[#f + 1], f[#f + 2] = historySlot(i), v
    end
  end
  if got then
    f[#f + 1], f[#f + 2] = 'hx', historyDrop(hist, got)
  end
  if hist.prev_node ~= (hist.last_node or hist.h0_node) then
    f[#f + 1], f[#f + 2] = 'hl', hist.prev_node
  end
  f[#f + 1], f[#f + 2] = 'hn', n
  f[#f + 1], f[#f + 2] = 'updated', now_ms
  f[#f + 1], f[#f + 2] = 'hu', now_ms
  if write_base then
    f[#f + 1], f[#f + 2] = 'hb', hist.base
  end
end

-- historyCallerFields appends ARGV[first ..] (field, value, ...), the
-- caller's record fields, to f, less any of the history's fields.
local function historyCallerFields(f, args, first)
  for i = first, #args - 1, 2 do
    if not historyOwns(args[i]) then
      f[#f + 1], f[#f + 2] = args[i], args[i + 1]
    end
  end
end
