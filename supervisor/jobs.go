// Package supervisor builds the node's actor tree around the job actors: the
// job supervisor shards that spawn, route to and stop them, and the intake
// that feeds them from JetStream.
package supervisor

import (
	"hash/fnv"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/actors"
)

// Deliver routes Msg to the job actor of JobID. With Spawn set, the actor is
// spawned when none is live; without it (progress), the message is dropped.
type Deliver struct {
	JobID string
	Msg   interface{}
	Spawn bool
}

// CountLive asks a shard how many job actors it supervises; reply: int.
type CountLive struct{}

// JobShard supervises the job actors whose ids hash to it. It keeps its own
// index of live children so routing a message is a map lookup, and it
// stops a finished child with a poison pill, so messages already in the
// child's mailbox are still handled (a Stop would silently drop them). While
// a child is stopping, new messages for its job wait here and go to a fresh
// actor once the old one has terminated: one job never has two actors.
type JobShard struct {
	props *actor.Props

	// Owned by the actor.
	live     map[string]*actor.PID
	stopping map[string][]*Deliver
}

// jobSupervision restarts a crashed job actor a few times; the fresh instance
// starts from Redis when its next message arrives. Small budgets on purpose:
// restart statistics cost O(failures) (PROTOACTOR-NOTES §2.7).
func jobSupervision() actor.SupervisorStrategy {
	return actor.NewOneForOneStrategy(3, time.Minute, func(reason interface{}) actor.Directive {
		return actor.RestartDirective
	})
}

// ShardProps returns the props of one job supervisor shard.
func ShardProps(jobProps *actor.Props, opts ...actor.PropsOption) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &JobShard{props: jobProps, live: map[string]*actor.PID{}, stopping: map[string][]*Deliver{}}
	}, append(opts, actor.WithSupervisor(jobSupervision()))...)
}

// Receive handles the shard's messages.
func (s *JobShard) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *Deliver:
		s.deliver(c, m)
	case *actors.Finished:
		if pid, ok := s.live[m.JobID]; ok && pid.Equal(m.PID) {
			delete(s.live, m.JobID)
			s.stopping[m.JobID] = nil
			c.Poison(m.PID)
		}
	case *actor.Terminated:
		id := strings.TrimPrefix(m.Who.Id, c.Self().Id+"/")
		if pid, ok := s.live[id]; ok && pid.Equal(m.Who) {
			delete(s.live, id) // stopped by supervision, not by Finished
		}
		buf, ok := s.stopping[id]
		if !ok {
			return
		}
		delete(s.stopping, id)
		for _, d := range buf {
			s.deliver(c, d)
		}
	case *CountLive:
		c.Respond(len(s.live))
	}
}

func (s *JobShard) deliver(c actor.Context, m *Deliver) {
	if buf, ok := s.stopping[m.JobID]; ok {
		s.stopping[m.JobID] = append(buf, m)
		return
	}
	pid, ok := s.live[m.JobID]
	if !ok {
		if !m.Spawn {
			return
		}
		var err error
		pid, err = c.SpawnNamed(s.props, m.JobID)
		if err != nil {
			// The name is still registered (a child terminating outside
			// our bookkeeping); reach it by name.
			pid = actor.NewPID(c.Self().Address, c.Self().Id+"/"+m.JobID)
		}
		s.live[m.JobID] = pid
	}
	c.Send(pid, m.Msg)
}

// ShardFor returns the index of the shard that owns jobID among n.
func ShardFor(jobID string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(jobID))
	return int(h.Sum32() % uint32(n))
}
