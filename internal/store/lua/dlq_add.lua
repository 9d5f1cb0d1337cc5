-- dlq_add: appends an entry to the DLQ stream within the stream's byte
-- budget (see dlqWrite in lib/dlq_write.lua, which runs in front of this).
--
-- KEYS[1]  dlq_key   the DLQ stream (Keys.DLQ)
-- ARGV[1]  max_len   the stream's approximate MAXLEN
-- ARGV[2]  budget    the stream's byte budget
-- ARGV[3]  size      the entry's bytes
-- ARGV[4..] the entry's field, value pairs
--
-- Returns the entry's stream id.
local max_len = ARGV[1]
local budget = tonumber(ARGV[2])
local size = tonumber(ARGV[3])
local first_field = 4

return dlqWrite(max_len, budget, size, first_field)
