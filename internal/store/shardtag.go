package store

// ShardTag is the key prefix of shard ("<prefix>{NN}:"), for readers that
// scan a per-shard key (such as a workflow's saga stack) over every shard
// without knowing a job id of the shard.
func (k *Keys) ShardTag(shard int) string { return k.tags[shard] }
