package troupe

import (
	"time"

	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/supervisor"
)

// DeliverToJob sends msg to the live actor of jobID (tests inject faults
// with it); nothing happens if the job has no live actor.
func (n *Node) DeliverToJob(jobID string, msg interface{}) {
	shard := n.shards[supervisor.ShardFor(jobID, len(n.shards))]
	n.sys.Root.Send(shard, &supervisor.Deliver{JobID: jobID, Msg: msg})
}

// ParkedInMemory counts the parked DISPATCHED jobs the node's shards
// remember.
func (n *Node) ParkedInMemory() (int, error) {
	total := 0
	for _, pid := range n.shards {
		res, err := n.sys.Root.RequestFuture(pid, &supervisor.CountParked{}, 5*time.Second).Result()
		if err != nil {
			return 0, err
		}
		total += res.(int)
	}
	return total, nil
}

// RenewStats is the node's lock renewer's counts.
func (n *Node) RenewStats() store.RenewStats { return n.renewer.Stats() }

// Admitting is the node's count of jobs taken from the submit stream and
// not yet dispatched, written as waiting, or finished.
func (n *Node) Admitting() int64 { return n.env.Admitting.Load() }

// BeforeActorsStop sets a function Stop runs once the node's inbox refuses
// forwarded events and before its job actors stop.
func (n *Node) BeforeActorsStop(f func()) { n.beforeActorsStop = f }

// Conn is a in the dialer's form (tests dial a worker with the node's
// settings).
func (a NATSAuth) Conn() connect.NATS { return a.conn() }

// IndexAlone puts jobID in the node's index of waits left alone, as an
// approval (tests give a second node the entry a replica can keep for a
// job another replica parked later).
func (n *Node) IndexAlone(jobID string) {
	n.alone.Add(jobID, lifecycle.WaitApproval, time.Time{})
}

// DueInterval is the due poller's present interval (DuePoll while its
// ticks wake jobs, up to DueIdlePoll while they find nothing).
func (n *Node) DueInterval() time.Duration { return n.due.Interval() }
