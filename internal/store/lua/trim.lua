-- trim: the retention trim of one terminal-state index of a shard. It
-- deletes each listed job's record (its history included) with its entry
-- in the index: a job's terminal write scores its entry with its time and
-- sets no expiry on the record, so this is how a finished job's record
-- goes once its retention has passed. The due poller runs it now and then
-- with the ids it has just read from the index (ZRANGEBYSCORE up to the
-- cutoff), so transitions do not pay for it. An id whose entry is gone
-- since (a downgrade from SUCCEEDED moved it to OUTPUT_QUARANTINED's index,
-- or another trim took it) keeps its record: only a removed entry deletes
-- one. A terminal entry is never re-scored in its index (a job ends once),
-- so an entry still there is still past the cutoff. A record that expired
-- already (written with an EXPIRE by an older version) costs a DEL of
-- nothing.
--
-- KEYS[1]      the index (Keys.Index)
-- KEYS[2 ..]   the records (Keys.Job) of the jobs in ARGV, in order
-- ARGV[1 ..]   the job ids
--
-- Returns how many records (and entries) it dropped.
local index_key = KEYS[1]

local n = 0
for i = 1, #ARGV do
  if redis.call('ZREM', index_key, ARGV[i]) == 1 then
    redis.call('DEL', KEYS[i + 1])
    n = n + 1
  end
end
return n
