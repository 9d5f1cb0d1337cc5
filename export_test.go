package troupe

import "github.com/troupe-run/troupe/supervisor"

// DeliverToJob sends msg to the live actor of jobID (tests inject faults
// with it); nothing happens if the job has no live actor.
func (n *Node) DeliverToJob(jobID string, msg interface{}) {
	shard := n.shards[supervisor.ShardFor(jobID, len(n.shards))]
	n.sys.Root.Send(shard, &supervisor.Deliver{JobID: jobID, Msg: msg})
}
