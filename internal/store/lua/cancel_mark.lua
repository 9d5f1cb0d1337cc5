-- cancel_mark: records a cancel for a job that has no record yet (its
-- submit still held in the stream, taken by no node), so that the job is
-- created CANCELLED when a node takes it (see activate.lua), or names the
-- job's record when it has one (the cancel then goes the usual way).
--
-- The mark is a hash in the job's shard: one field per tenant the
-- canceller may cancel for ('*': any tenant), value "<by>\n<reason>". A
-- job is cancelled by the mark only if it names the job's tenant or '*'
-- (a cancel from one tenant never ends another tenant's job). Each write
-- sets the mark's expiry to ttl_ms: a mark for a job that never arrives
-- goes away by itself.
--
-- KEYS[1]  job_key   the job's record (Keys.Job)
-- KEYS[2]  mark_key  the job's cancel mark (Keys.CancelMark)
-- ARGV[1]  by        who cancelled (no newline)
-- ARGV[2]  reason    why
-- ARGV[3]  ttl_ms    how long the mark is kept
-- ARGV[4 ..]         the tenants the mark applies to ('*': any)
--
-- Returns EXISTS (the job has a record; nothing changed) or MARKED.
local job_key = KEYS[1]
local mark_key = KEYS[2]
local by = ARGV[1]
local reason = ARGV[2]
local ttl_ms = ARGV[3]

if redis.call('EXISTS', job_key) == 1 then
  return 'EXISTS'
end
for i = 4, #ARGV do
  redis.call('HSET', mark_key, ARGV[i], by .. '\n' .. reason)
end
redis.call('PEXPIRE', mark_key, ttl_ms)
return 'MARKED'
