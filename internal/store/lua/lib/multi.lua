-- multi: runs one script for several jobs in one call. multiScript puts
-- the script in front of this as the local function one(), and its KEYS[i],
-- ARGV[i] and #ARGV as KEYS[mko + i], ARGV[mao + i] and man, which this
-- sets before each job's run, so that each run reads its own job's KEYS
-- and ARGV as a call of its own would pass them. The jobs' keys follow one
-- another in KEYS, their arguments in ARGV after a header:
--
-- KEYS               job 1's keys, then job 2's, ...
-- ARGV[1]  m         the number of jobs
-- ARGV[2 .. 1+2m]    per job: its number of keys, its number of arguments
-- ARGV[2+2m ..]      job 1's arguments, then job 2's, ...
--
-- Returns one reply per job, in order: the script's reply, or an error
-- reply for a job whose run raised (a failed redis.call: what a call of
-- its own would have answered), which leaves the other jobs' runs alone.
local m = tonumber(ARGV[1])
local out = {}
mko, mao = 0, 1 + 2 * m
for j = 1, m do
  mkn, man = tonumber(ARGV[2 * j]), tonumber(ARGV[2 * j + 1])
  local ok, r = pcall(one)
  if ok then
    out[j] = r
  elseif type(r) == 'table' and r.err then
    out[j] = r
  else
    out[j] = {err = tostring(r)}
  end
  mko, mao = mko + mkn, mao + man
end
return out
