-- dead_node: changes a dead node's score in the nodes set from its last
-- lease renewal to a mark (the mark "adoption under way"), or removes the
-- node (mark "forget"), only if the node has not renewed since the caller
-- saw it dead.
--
-- KEYS[1]  nodes_key  the nodes set (Keys.Nodes)
-- ARGV[1]  node
-- ARGV[2]  before_ms  the node's score must be below this
-- ARGV[3]  mark       the node's new score, or "forget"
--
-- Returns 1 if it changed the nodes set, 0 otherwise.
local nodes_key = KEYS[1]
local node = ARGV[1]
local before_ms = tonumber(ARGV[2])
local mark = ARGV[3]

local s = tonumber(redis.call('ZSCORE', nodes_key, node) or '')
if s and s < before_ms then
  if mark == 'forget' then
    redis.call('ZREM', nodes_key, node)
  else
    redis.call('ZADD', nodes_key, mark, node)
  end
  return 1
end
return 0
