-- multi: runs one script for several jobs in one call. multiScript puts
-- the script in front of this as the local function one(), and its KEYS[i]
-- and #KEYS as KEYS[mko + i] and mkn, its ARGV[i] and #ARGV as ma[1 + i]
-- and man, which this sets before each job's run, so that each run reads
-- its own job's KEYS and ARGV as a call of its own would pass them. The
-- jobs' keys follow one another in KEYS; their arguments come packed in
-- one (store/packedargs.go), which cmsgpack decodes in C:
--
-- KEYS       job 1's keys, then job 2's, ...
-- ARGV[1]    a MessagePack array, per job: {its number of keys, its
--            arguments, each a string}
--
-- Returns one reply per job, in order: the script's reply (an array of
-- strings) packed by cmsgpack in one string, which the Writer reads in
-- place (one string a job for go-redis to read, not one per element), or
-- an error reply for a job whose run raised (a failed redis.call: what a
-- call of its own would have answered), which leaves the other jobs' runs
-- alone.
local jobs = cmsgpack.unpack(ARGV[1])
local out = {}
for j = 1, #jobs do
  ma = jobs[j]
  mkn, man = ma[1], #ma - 1
  local ok, r = pcall(one)
  if ok then
    out[j] = cmsgpack.pack(r)
  elseif type(r) == 'table' and r.err then
    out[j] = r
  else
    out[j] = {err = tostring(r)}
  end
  mko = mko + mkn
end
return out
