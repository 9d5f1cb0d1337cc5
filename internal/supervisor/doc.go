// Package supervisor keeps the node's job actors: the job supervisor shards
// that spawn, route to and stop them, the supervision strategy applied when
// one fails, and the pooled dispatcher their mailboxes run on.
//
// One duty a file:
//   - jobs.go: the job shards (JobShard) and the messages they take —
//     Deliver (spawning on demand), the finished/terminated bookkeeping that
//     keeps one actor per job, the memory of jobs parked here in DISPATCHED,
//     and ShardFor, which picks a job's shard;
//   - strategy.go: the supervision strategy — a transient failure restarts
//     the job actor within RestartBudget per RestartWindow, anything else
//     stops it and the shard fails the job (actor_failed);
//   - dispatcher.go: PoolDispatcher, the long-lived goroutines that run job
//     and shard mailboxes.
//
// What it does not do: read the bus (package intake turns bus messages into
// Deliver messages), find jobs to wake (package recovery, through the
// intake), or decide anything about a job (packages jobactor and
// lifecycle).
package supervisor
