-- history, shared by activate.lua, transition.lua and downgrade.lua, keeps
-- a job's history in fields of its record (Keys.Job): h holds the entries
-- ("unix_ms|from|to|reason|node"), oldest first, one a line; hn how many
-- entries h holds; hu the record's "updated" time as of the last write of
-- h. A script reads them together with the record's state (one HMGET) and
-- writes them, and "updated", in the HSET it makes anyway, after the
-- caller's fields (historyFields), so recording a transition costs no
-- command of its own. These functions call no command: they take no KEYS
-- and read no ARGV.
--
-- Older versions kept the history in a list (Keys.LegacyHistory) and wrote
-- none of these fields, but set "updated" as these scripts do. So a record
-- whose hu differs from its "updated" (hu absent included) was last written
-- by an older version, and its list holds the entries h lacks: the script
-- that writes the record next reads the list, appends the list's entries
-- to h and then its own, and deletes the list (see transition.lua).
--
-- A history is bounded. Past HIST_HEAD + HIST_TAIL entries it keeps the
-- first HIST_HEAD entries, then one marker entry standing for the ones it
-- dropped, then the latest HIST_TAIL. The marker is
-- "unix_ms|from|to|history_elided|count": the first dropped entry's time and
-- from state, the last dropped entry's to state, and how many entries it
-- stands for; a later cut folds the marker and the entries after it into a
-- new one. store.HistoryHead, store.HistoryTail and store.HistoryElided are
-- the same numbers and reason on the Go side (store.ParseHistory).
local HIST_HEAD = 16
local HIST_TAIL = 240

-- historyClean returns s with every '|' and newline replaced by '_'. Node
-- ids (letters, digits and _ - . :) and reasons (core's codes) contain
-- neither; this only keeps a bad value from breaking its entry or its
-- neighbours.
local function historyClean(s)
  if string.find(s, '[|\n]') then
    return (string.gsub(s, '[|\n]', '_'))
  end
  return s
end

-- historyEntry returns one entry of the history.
local function historyEntry(ms, from, to, reason, node)
  return ms .. '|' .. historyClean(from) .. '|' .. historyClean(to) .. '|' .. historyClean(reason) .. '|' ..
    historyClean(node)
end

-- historyFields appends to f, the field-value list of the record's HSET
-- for a write at now_ms, the record's "updated" time and the history's
-- fields (h and hn as historyAppend returns them).
local function historyFields(f, now_ms, h, hn)
  local i = #f
  f[i + 1], f[i + 2] = 'updated', now_ms
  f[i + 3], f[i + 4] = 'h', h
  f[i + 5], f[i + 6] = 'hn', hn
  f[i + 7], f[i + 8] = 'hu', now_ms
end

-- historyAppend returns h and hn after the entries of add (a list, oldest
-- first) are appended, bounded as said above. h and hn are the fields'
-- values as HMGET gave them (false when absent).
local function historyAppend(h, hn, add)
  local n = (tonumber(hn) or 0) + #add
  if not h or h == '' then
    h = table.concat(add, '\n')
  elseif #add > 0 then
    h = h .. '\n' .. table.concat(add, '\n')
  end
  local over = n - HIST_HEAD - HIST_TAIL
  if over <= 0 then
    return h, n
  end
  -- The over entries after the first HIST_HEAD (the first of them is the
  -- marker of an earlier cut, if there was one) give way to one marker.
  local pos = 1
  for _ = 1, HIST_HEAD do
    pos = string.find(h, '\n', pos, true) + 1
  end
  local cut_start, last_start, cut_end = pos, pos, pos
  for _ = 1, over do
    last_start = pos
    cut_end = string.find(h, '\n', pos, true)
    pos = cut_end + 1
  end
  local first = string.sub(h, cut_start, string.find(h, '\n', cut_start, true) - 1)
  local ms, from, reason, rest = string.match(first, '^([^|]*)|([^|]*)|[^|]*|([^|]*)|(.*)$')
  local count = over
  if reason == 'history_elided' and tonumber(rest) then
    count = tonumber(rest) + over - 1
  end
  local to = string.match(string.sub(h, last_start, cut_end - 1), '^[^|]*|[^|]*|([^|]*)') or ''
  local marker = (ms or '') .. '|' .. (from or '') .. '|' .. to .. '|history_elided|' .. count
  return string.sub(h, 1, cut_start - 1) .. marker .. string.sub(h, cut_end), HIST_HEAD + 1 + HIST_TAIL
end
