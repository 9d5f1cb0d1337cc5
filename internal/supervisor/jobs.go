package supervisor

import (
	"hash/fnv"
	"hash/maphash"
	"log/slog"
	"strings"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/jobactor"
)

// Deliver routes Msg to the job actor of JobID. With Spawn set, the actor is
// spawned when none is live; without it (progress, a worker's eviction), the
// message is dropped — unless the job is parked on this node in DISPATCHED,
// the one case where this node must act on it.
type Deliver struct {
	JobID string
	Msg   interface{}
	Spawn bool
	// resolved: the shard's Resolver has read the job's lock and handed
	// the event back to a job actor.
	resolved bool
}

// CountLive asks a shard how many job actors it supervises; reply: int.
type CountLive struct{}

// RememberParked tells a shard that these jobs are parked on this node in
// DISPATCHED (a node restarted under the same id reads them from Redis).
type RememberParked struct{ JobIDs []string }

// TellLive hands Msg to every job actor live in the shard (a message for
// all the jobs this node runs, such as jobactor.ResultsLost).
type TellLive struct{ Msg interface{} }

// CountParked asks a shard how many jobs it remembers as parked in
// DISPATCHED; reply: int.
type CountParked struct{}

// JobShard supervises the job actors whose ids hash to it. It keeps its own
// index of live children so routing a message is a map lookup, and it
// stops a finished child with a poison pill, so messages already in the
// child's mailbox are still handled (a Stop would silently drop them). While
// a child is stopping, new messages for its job wait here and go to a fresh
// actor once the old one has terminated: one job never has two actors.
//
// It also remembers which jobs were parked here while DISPATCHED (by a hash
// of the id: 8 bytes and no string per job, so a million parked jobs cost
// tens of MB, not hundreds). A parked job has no actor, and the events that
// reach only the dispatching node — the worker's progress (core NATS, every
// replica sees it; only the owner must record RUNNING) and the worker's
// eviction (told by this node's router) — would otherwise be dropped. A hash
// collision only spawns an actor that finds nothing to do.
type JobShard struct {
	props    *actor.Props
	strategy *jobStrategy
	log      *slog.Logger
	resolver *Resolver // nil: every event for a job with no actor spawns one

	// Owned by the actor.
	//
	// jobs is a job's actor, live or stopping: one entry a job, looked up
	// once per event (it was two maps, live and stopping, and a job's
	// events, its stop and its end looked each up: ~15 string hashes a
	// job, ~7 now).
	jobs  map[string]*child
	liveN int      // entries of jobs not stopping
	free  []*child // entries deleted from jobs, for the next jobs
	// abandoned counts, per job, the actors stopped by supervision while
	// abandoning it; past one, the shard leaves the job to its lease.
	abandoned    map[string]int
	shuttingDown bool
	parked       map[uint64]bool // true: parked DISPATCHED (else RUNNING)
	peak         int             // most entries parked has held since it was last rebuilt
	seed         maphash.Seed
}

// child is a job's actor as its shard knows it.
type child struct {
	pid *actor.PID // the live actor, or the stopping one
	// stopping: the actor finished and was poisoned; new events for its
	// job wait in buf and go to a fresh actor once it has terminated.
	stopping bool
	buf      []*Deliver
}

// newChild is an entry for pid, live, from the free list if it can be.
func (s *JobShard) newChild(pid *actor.PID) *child {
	s.liveN++
	if n := len(s.free); n > 0 {
		ch := s.free[n-1]
		s.free = s.free[:n-1]
		ch.pid = pid
		return ch
	}
	return &child{pid: pid}
}

// drop deletes jobID's entry ch and keeps it for a next job (its buf is
// not: whoever took ch.buf may still be reading it).
func (s *JobShard) drop(jobID string, ch *child) {
	delete(s.jobs, jobID)
	if !ch.stopping {
		s.liveN--
	}
	*ch = child{}
	if len(s.free) < maxFreeChildren {
		s.free = append(s.free, ch)
	}
}

// maxFreeChildren bounds a shard's free list.
const maxFreeChildren = 1024

// parkedShrinkAt: a Go map keeps its buckets when emptied, so once the
// parked set has held this many and fallen to a quarter of its peak, it is
// copied into a map of the right size.
const parkedShrinkAt = 1 << 16

// ShardPropsResolving returns the props of one job supervisor shard, with a
// Resolver for results and cancels of jobs the shard has no actor for (nil:
// none).
func ShardPropsResolving(jobProps *actor.Props, log *slog.Logger, res *Resolver, opts ...actor.PropsOption) *actor.Props {
	strategy := newJobStrategy()
	return actor.PropsFromProducer(func() actor.Actor {
		return &JobShard{props: jobProps, strategy: strategy, log: log, resolver: res, jobs: map[string]*child{},
			abandoned: map[string]int{},
			parked:    map[uint64]bool{}, seed: maphash.MakeSeed()}
	}, append(opts, actor.WithSupervisor(strategy))...)
}

// Receive handles the shard's messages.
func (s *JobShard) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *Deliver:
		s.deliver(c, m)
	case *jobactor.Finished:
		if ch := s.jobs[m.JobID]; ch != nil && !ch.stopping && ch.pid.Equal(m.PID) {
			ch.stopping = true
			s.liveN--
			c.Poison(m.PID)
			if m.Parked {
				s.parked[s.hash(m.JobID)] = !m.Running
				s.peak = max(s.peak, len(s.parked))
			}
			for _, msg := range m.Redeliver {
				// Delivered once the actor has terminated, to a fresh one.
				ch.buf = append(ch.buf, &Deliver{JobID: m.JobID, Msg: msg, Spawn: spawnsAlways(msg)})
			}
		}
	case *jobactor.Redeliver:
		// Events that reached a job's actor after it parked the job: they
		// follow its Finished, so the job is stopping or parked here, and
		// they go to its next actor.
		for _, msg := range m.Msgs {
			s.deliver(c, &Deliver{JobID: m.JobID, Msg: msg, Spawn: spawnsAlways(msg)})
		}
	case *actor.Stopping:
		s.shuttingDown = true // children stop with the shard: not failures
	case *actor.Terminated:
		id := strings.TrimPrefix(m.Who.Id, c.Self().Id+"/")
		ch := s.jobs[id]
		if ch != nil && !ch.stopping && ch.pid.Equal(m.Who) {
			// Stopped by supervision (a failure it would not restart), or
			// by the shard's own stop.
			s.drop(id, ch)
			if why := s.strategy.takeReason(m.Who); why != "" && !s.shuttingDown {
				s.abandon(c, id, why)
			}
			return
		}
		s.strategy.takeReason(m.Who)
		delete(s.abandoned, id)
		if ch == nil || !ch.stopping {
			return
		}
		buf := ch.buf
		s.drop(id, ch)
		for _, d := range buf {
			s.deliver(c, d)
		}
	case *CountLive:
		c.Respond(s.liveN)
	case *TellLive:
		for _, ch := range s.jobs {
			if !ch.stopping {
				c.Send(ch.pid, m.Msg)
			}
		}
	case *CountParked:
		c.Respond(len(s.parked))
	case *RememberParked:
		for _, id := range m.JobIDs {
			if ch := s.jobs[id]; ch == nil || ch.stopping {
				s.parked[s.hash(id)] = true
			}
		}
		s.peak = max(s.peak, len(s.parked))
	}
}

func (s *JobShard) hash(jobID string) uint64 { return maphash.String(s.seed, jobID) }

func (s *JobShard) shrinkParked() {
	if s.peak < parkedShrinkAt || len(s.parked) > s.peak/4 {
		return
	}
	m := make(map[uint64]bool, len(s.parked))
	for h, v := range s.parked {
		m[h] = v
	}
	s.parked, s.peak = m, len(m)
}

// wakesParked reports whether msg, for a job with no live actor, must spawn
// one because the job is parked here (dispatched: in DISPATCHED, else
// RUNNING). Only the dispatching node acts on a worker's first progress or
// its eviction; a RUNNING job's further progress changes nothing.
func wakesParked(msg interface{}, dispatched bool) bool {
	switch msg.(type) {
	case *jobactor.Progress:
		return dispatched
	case *jobactor.WorkerLost, *jobactor.ResultsLost:
		return true
	}
	return false
}

// spawnsAlways reports whether msg, handed back by a job's actor, spawns
// the job's next actor even when the shard does not remember the job
// parked: the rate limiter's answer to a parked ask (the grant's units are
// the job's; its actor uses them or gives them back), and a lost wait's
// wake.
func spawnsAlways(msg interface{}) bool {
	switch m := msg.(type) {
	case *jobactor.Tokens:
		return true
	case *jobactor.Wake:
		// A lost wait's wake handed on (an actor restarted before the job
		// ended): nothing else will ever wake the job.
		return m.Lost
	}
	return false
}

// abandon handles a job actor that supervision stopped (a failure that is
// not transient, or one past the restart budget): a fresh actor marks the
// job FAILED with reason actor_failed. If that actor fails too, the shard
// gives up on the job on this node; its lock lapses and the due poller of
// a replica (or this one) adopts it.
func (s *JobShard) abandon(c actor.Context, jobID, why string) {
	s.abandoned[jobID]++
	if s.abandoned[jobID] > 1 {
		delete(s.abandoned, jobID)
		s.log.Error("job actor failed again while failing its job; leaving the job to its lease",
			"job_id", jobID, "err", why)
		return
	}
	s.deliver(c, &Deliver{JobID: jobID, Msg: &jobactor.Abandon{Detail: "job actor failed: " + why}, Spawn: true})
}

func (s *JobShard) deliver(c actor.Context, m *Deliver) {
	ch := s.jobs[m.JobID]
	if ch != nil && ch.stopping {
		ch.buf = append(ch.buf, m)
		return
	}
	if ch == nil {
		// Nothing parked (as a rule: a node parks jobs only while their
		// workers run them long): no hash of the id to look up.
		var h uint64
		var dispatched, parked bool
		if len(s.parked) > 0 {
			h = s.hash(m.JobID)
			dispatched, parked = s.parked[h]
		}
		if !m.Spawn && !(parked && wakesParked(m.Msg, dispatched)) {
			return
		}
		if !parked && !m.resolved && s.resolver != nil {
			if _, _, _, ok := forwardable(m.Msg); ok && s.resolver.ask(c.Self(), m) {
				return // another node's job, most likely: see Resolver
			}
		}
		if parked {
			delete(s.parked, h) // the new actor parks it again if it must
			s.shrinkParked()
		}
		pid, err := c.SpawnNamed(s.props, m.JobID)
		if err != nil {
			// The name is still registered (a child terminating outside
			// our bookkeeping); reach it by name.
			pid = actor.NewPID(c.Self().Address, c.Self().Id+"/"+m.JobID)
		}
		ch = s.newChild(pid)
		s.jobs[m.JobID] = ch
	}
	c.Send(ch.pid, m.Msg)
}

// ShardFor returns the index of the shard that owns jobID among n.
func ShardFor(jobID string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(jobID))
	return int(h.Sum32() % uint32(n))
}
