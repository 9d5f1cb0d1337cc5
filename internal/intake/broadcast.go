package intake

import "github.com/troupe-run/troupe/internal/supervisor"

// Messages for many jobs at once.

// TellLive delivers msg to every job actor live on this node.
func (in *Intake) TellLive(msg interface{}) {
	for _, shard := range in.Shards {
		in.Env.Root.Send(shard, &supervisor.TellLive{Msg: msg})
	}
}

// TellSpawn delivers msg to the job's actor, spawning one if none is live
// (a job parked on this node, known from Redis).
func (in *Intake) TellSpawn(jobID string, msg interface{}) { in.route(jobID, msg, true) }
