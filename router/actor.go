package router

import (
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/registry"
)

// PickRequest asks the router for a worker. Send it with ctx.Request so the
// reply (a *PickReply) comes back to the asking job actor as a message.
type PickRequest struct {
	JobID string
	Req   *capv1.JobRequest
	// Epoch is echoed in the reply so the job can drop answers to questions
	// it no longer asks.
	Epoch uint64
}

// PickReply answers a PickRequest: WorkerID and Subject on success, or a
// Reason saying why there is no worker.
type PickReply struct {
	Epoch    uint64
	WorkerID string
	Subject  string
	Reason   core.Reason
	Detail   string
}

// HeartbeatSeen delivers a worker heartbeat to the router.
type HeartbeatSeen struct {
	HB *capv1.Heartbeat
	At time.Time
}

// SetPools swaps the pool routing config.
type SetPools struct{ Config *PoolConfig }

// ListWorkers asks for a snapshot of the registry; the reply is []WorkerInfo.
type ListWorkers struct{}

// WorkerInfo is a copy of one registry entry, safe to use outside the router.
type WorkerInfo struct {
	ID          string
	Pool        string
	ActiveJobs  int32
	Dispatched  int32
	MaxParallel int32
	CPULoad     float32
	GPUUtil     float32
	Direct      bool
	LastSeen    time.Time
	Labels      map[string]string
}

type sweepTick struct{}

// Router is the actor that owns the worker registry and the placement
// strategy. It never waits on I/O: heartbeats arrive as messages, picks are
// answered from memory.
type Router struct {
	// Owned by the actor (touched only inside Receive).
	reg      *registry.Registry
	strategy *Strategy
	log      *slog.Logger
	now      func() time.Time
	stopTick chan struct{}
}

// Config configures the router actor.
type Config struct {
	Pools     *PoolConfig
	TTL       time.Duration
	Direct    func(workerID string) string
	PoolSubj  func(topic string) string
	Log       *slog.Logger
	SweepEach time.Duration
}

// Props returns the router actor's props.
func Props(cfg Config) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		reg := registry.New(cfg.TTL)
		return &Router{reg: reg, strategy: NewStrategy(cfg.Pools, reg, cfg.Direct, cfg.PoolSubj),
			log: cfg.Log, now: time.Now}
	})
}

// Receive handles the router's messages.
func (r *Router) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		r.startSweeper(c)
	case *actor.Stopping:
		if r.stopTick != nil {
			close(r.stopTick)
		}
	case *HeartbeatSeen:
		if m.HB.GetWorkerId() == "" {
			return
		}
		r.reg.Observe(m.HB, m.At)
	case *PickRequest:
		p := r.strategy.Pick(m.Req, r.now())
		reply := &PickReply{Epoch: m.Epoch, Subject: p.Subject, Reason: p.Reason, Detail: p.Detail}
		if p.Worker != nil {
			reply.WorkerID = p.Worker.ID
		}
		c.Respond(reply)
	case *SetPools:
		r.strategy.SetConfig(m.Config)
	case *ListWorkers:
		out := make([]WorkerInfo, 0, r.reg.Len())
		now := r.now()
		for _, p := range sortedPools(r.strategy.Config(), r.reg) {
			for _, w := range r.reg.Pool(p) {
				if !r.reg.Live(w, now) {
					continue
				}
				out = append(out, WorkerInfo{ID: w.ID, Pool: w.Pool, ActiveJobs: w.ActiveJobs, Dispatched: w.Dispatched,
					MaxParallel: w.MaxParallel, CPULoad: w.CPULoad, GPUUtil: w.GPUUtil, Direct: w.Direct,
					LastSeen: w.LastSeen, Labels: w.Labels})
			}
		}
		c.Respond(out)
	case sweepTick:
		for _, w := range r.reg.Sweep(r.now()) {
			r.log.Info("worker evicted", "worker_id", w.ID, "pool", w.Pool, "last_seen", w.LastSeen)
		}
	}
}

func (r *Router) startSweeper(c actor.Context) {
	every := r.reg.TTL() / 3
	r.stopTick = make(chan struct{})
	self, root, stop := c.Self(), c.ActorSystem().Root, r.stopTick
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				root.Send(self, sweepTick{})
			}
		}
	}()
}

func sortedPools(cfg *PoolConfig, reg *registry.Registry) []string {
	seen := map[string]bool{}
	var out []string
	for _, t := range cfg.TopicNames() {
		for _, p := range cfg.Topics[t] {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}
