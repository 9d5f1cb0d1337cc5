-- dlq_append: appends an entry that waited in a job's DLQ outbox to the
-- DLQ stream, unless its mark says the stream has it already: an outbox
-- entry is moved at least once, and reaches the stream once. The stream's
-- byte budget holds as for any entry (see dlqWrite in lib/dlq_write.lua,
-- which runs in front of this).
--
-- KEYS[1]  dlq_key   the DLQ stream (Keys.DLQ)
-- KEYS[2]  mark_key  the entry's mark, in the stream's slot (Keys.DLQMark)
-- ARGV[1]  mark_ttl_s
-- ARGV[2]  max_len   the stream's approximate MAXLEN
-- ARGV[3]  budget    the stream's byte budget
-- ARGV[4]  size      the entry's bytes
-- ARGV[5..] the entry's field, value pairs
--
-- Returns 0 if the stream had the entry already, else its stream id.
local mark_key = KEYS[2]
local mark_ttl_s = ARGV[1]
local max_len = ARGV[2]
local budget = tonumber(ARGV[3])
local size = tonumber(ARGV[4])
local first_field = 5

if not redis.call('SET', mark_key, '1', 'NX', 'EX', mark_ttl_s) then return 0 end
return dlqWrite(max_len, budget, size, first_field)
