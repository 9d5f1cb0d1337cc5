package router

import (
	"cmp"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/proto/capv1"
)

// SweepEachDefault is how often the router evicts workers past their
// liveness window. Eviction tells OnEvict which worker went away, so the
// jobs sent to it can be re-dispatched; a second of delay is small next to
// a TTL of several heartbeats, and a sweep of 10k workers costs well under
// a millisecond of the router's time.
const SweepEachDefault = time.Second

// The messages between a job and the router are the decision core's
// (internal/lifecycle), which names no router type; see lifecycle.PickRequest.
type (
	PickRequest = lifecycle.PickRequest
	PickReply   = lifecycle.PickReply
	Placed      = lifecycle.Placed
	Took        = lifecycle.Took
	Withdraw    = lifecycle.Withdraw
	Occupied    = lifecycle.Occupied
	Released    = lifecycle.Released
)

// Announce makes the router publish a full capacity report now: the node
// sends it once it listens for the other replicas' reports, so that they
// answer with theirs and the replicas know each other at once.
type Announce struct{}

// QueuePosition asks where a job waits; the reply is an int, -1 when it
// does not wait in this router's queue.
type QueuePosition struct{ JobID string }

// FindWaiting asks about a job waiting in this router's capacity queue; the
// reply is a *Waiting, nil when it does not wait here.
type FindWaiting struct{ JobID string }

// Waiting describes a job waiting for room: where it stands in its pools'
// queue (Position jobs before it) and since when, on which node.
type Waiting struct {
	JobID    string          `json:"job_id"`
	Topic    string          `json:"topic"`
	Tenant   string          `json:"tenant"`
	Reason   jobstate.Reason `json:"reason"`
	Position int             `json:"position"`
	Pools    []string        `json:"pools,omitempty"`
	Since    time.Time       `json:"since"`
	Node     string          `json:"node"`
	// Labels are the job's request labels (a copy), for filters.
	Labels map[string]string `json:"labels,omitempty"`
}

// ListWaiting asks for the jobs waiting in this router's capacity queue,
// of Tenant ("" for every tenant), newest first, at most Limit; reply:
// []Waiting (Position left -1: it is a walk of the queue per job).
type ListWaiting struct {
	Tenant string
	Limit  int
}

// ListPeers asks for the ids of the replicas this router hears; reply:
// []string.
type ListPeers struct{}

// Waitable reports whether a pick that failed for reason r should wait in
// the queue for room rather than back off: no room now, but room comes
// with a freed slot, a heartbeat or a new worker.
func Waitable(r jobstate.Reason) bool {
	switch r {
	case jobstate.ReasonPoolOverloaded, jobstate.ReasonNoWorkers, jobstate.ReasonStaleWorker, jobstate.ReasonPoolPaused:
		return true
	}
	return false
}

// HeartbeatSeen delivers a worker heartbeat to the router.
type HeartbeatSeen struct {
	HB *capv1.Heartbeat
	At time.Time
	// Sent is when the worker sent it (the packet's created_at; zero when
	// unknown): the registry learns heartbeat intervals from it.
	Sent time.Time
}

// SetPools swaps the pool routing config (the PoolsWatcher sends it).
type SetPools struct{ Config *PoolConfig }

// ListWorkers asks for a snapshot of the registry; the reply is []WorkerInfo.
type ListWorkers struct{}

// SnapshotRequest asks for a copy of the live registry; the reply is a
// *SnapshotReply. The SnapshotWriter sends it from its own goroutine.
type SnapshotRequest struct{}

// SnapshotReply is a copy of the workers live at At.
type SnapshotReply struct {
	At      time.Time
	Workers []registry.Entry
}

// Hydrate adds snapshot entries to the registry with last seen = now;
// workers already known (a live heartbeat came first) are kept as they are.
// When sent with a request, the reply is a *Hydrated.
type Hydrate struct{ Workers []registry.Entry }

// Hydrated says how many workers a Hydrate added.
type Hydrated struct{ Added int }

// WorkerInfo is a copy of one registry entry, safe to use outside the router.
type WorkerInfo struct {
	ID         string
	Pool       string
	ActiveJobs int32
	Dispatched int32 // this node's jobs on the worker
	// InFlight is the count placement uses (registry.Worker.InFlight), of
	// which Others are other replicas' jobs and Foreign the unexplained
	// rest of the last heartbeat.
	InFlight int32
	Others   int32
	Foreign  int32
	// Steward is the replica that places jobs on the worker (stewards.go).
	Steward string
	// Routed: some topic routes to the worker's pool (otherwise it gets no
	// jobs; see Strategy.Routed).
	Routed      bool
	MaxParallel int32
	CPULoad     float32
	GPUUtil     float32
	Direct      bool
	LastSeen    time.Time
	Labels      map[string]string
	// Interval is the worker's heartbeat interval as the router knows it
	// (announced, or the longest of its last four gaps; 0 while unknown);
	// TooSlow: its steady interval is over a third of the worker TTL
	// (registry.TooSlow).
	Interval time.Duration
	TooSlow  bool
}

type sweepTick struct{}

// Config configures the router actor. Every field's zero value is usable
// and keeps the behaviour of a router built before the field existed.
type Config struct {
	// Pools is the routing config at start (nil: no topic is mapped until a
	// SetPools arrives).
	Pools *PoolConfig
	// TTL bounds how long a worker stays live without a heartbeat (default
	// registry.TTLDefault); a worker whose interval is known is stale sooner,
	// after registry.MissedIntervals missed beats.
	TTL time.Duration
	// Direct names a worker's direct subject and PoolSubj a topic's pool
	// subject (default: CAP's standard names).
	Direct   func(workerID string) string
	PoolSubj func(topic string) string
	// Log receives the router's logs (default slog.Default()).
	Log *slog.Logger
	// SweepEach is how often workers past their window are evicted (default
	// SweepEachDefault, or TTL/3 when that is shorter).
	SweepEach time.Duration
	// StaleRetries is how many times a pick that lands on a stale worker is
	// re-picked before the answer is stale_worker (0: StaleRetriesDefault;
	// negative: never re-pick).
	StaleRetries int
	// Bounds caps the workers and pool names heartbeats may add (zero
	// fields: registry defaults).
	Bounds registry.Bounds
	// Metrics, when set, receives troupe_live_workers{pool},
	// troupe_workers_heartbeat_too_slow{pool},
	// troupe_stale_worker_retry_total{topic,worker} and
	// troupe_workers_evicted_total{pool}.
	Metrics prometheus.Registerer
	// OnEvict, when set, is called with the id of every worker the sweep
	// evicts, so the jobs dispatched to it can be re-dispatched. It runs on
	// the router's goroutine: it must return at once (send a message, do no
	// I/O) and must not call back into the router synchronously.
	OnEvict func(workerID string)
	// OnEvictJobs, when set, is called with an evicted worker's id, the
	// jobs of this node that occupy it — waiting for it to start them, or
	// started (a job decides what the loss means for it) — and the time of
	// the eviction; also later, for a job adopted or re-activated for a
	// worker already evicted (router/eviction.go). Same rules as OnEvict.
	OnEvictJobs func(workerID string, jobIDs []string, evictedAt time.Time)
	// Beats, when set, receives what this router hears of each worker, for
	// dispatches to carry (see Beats).
	Beats *Beats
	// Now is the router's clock (default time.Now; tests move it).
	Now func() time.Time
	// Link, when set, reports this node's NATS connection: whether it is
	// up, and how many times it has reconnected. While it is down, and at
	// the first sweep after a reconnect, no worker's silence is held
	// against it (registry.Reprieve): this node heard nobody, so silence
	// proves nothing — the same rule as after a pause.
	Link func() (up bool, reconnects uint64)
	// Heard, when set, counts the messages this node's NATS connection has
	// received (nats.Conn.Stats().InMsgs): traffic since a worker should
	// have spoken shows the bus carried messages then, so the worker's
	// silence is its own (see Router.hold). A node always has some: each
	// JetStream fetch is answered within FetchMaxWait, if only by a
	// timeout status.
	Heard func() uint64
	// NodeID and Gossip share this node's in-flight counts with the other
	// replicas (see gossip.go): Gossip publishes an encoded report, and the
	// node hands the reports it hears to the router as *PeerLoad. Nil
	// Gossip: a lone node, nothing is published.
	NodeID string
	Gossip func(data []byte)
	// OnPeers, when set with Gossip, is told how many other replicas this
	// router knows, each time that number changes (and 0 when it starts):
	// the intake hears the result subject itself only while there are
	// replicas to share results with (intake.SetPeers).
	OnPeers func(n int)
	// PickTTL frees the slot of a job's pick (or queued placement it took)
	// that the job neither started nor gave back within it: its actor
	// stopped or restarted before acting on the reply, or dropped the reply
	// as stale, and the slot would otherwise stay counted — and be reported
	// lost at the worker's eviction — for the worker's lifetime. It must
	// exceed the dispatch timeout, by which a dispatched job has started or
	// given its slot back (default PickTTLDefault; negative: never).
	PickTTL time.Duration
}

func (c Config) withDefaults() Config {
	if c.TTL <= 0 {
		c.TTL = registry.TTLDefault
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.SweepEach <= 0 {
		c.SweepEach = min(SweepEachDefault, c.TTL/3)
	}
	switch {
	case c.StaleRetries == 0:
		c.StaleRetries = StaleRetriesDefault
	case c.StaleRetries < 0:
		c.StaleRetries = 0
	}
	if c.PickTTL == 0 {
		c.PickTTL = PickTTLDefault
	}
	return c
}

// Router is the actor that owns the worker registry and the placement
// strategy. It never waits on I/O: heartbeats, config and snapshots arrive
// as messages, picks are answered from memory, and everything that talks to
// Redis (the PoolsWatcher, the SnapshotWriter) runs on its own goroutine.
type Router struct {
	// Immutable after construction.
	cfg     Config
	metrics *metrics // nil without Config.Metrics
	// latest outlives restarts: a restarted router resumes with the last
	// SetPools, not the config it was spawned with.
	latest *atomic.Pointer[PoolConfig]
	now    func() time.Time

	// Owned by the actor (touched only inside Receive).
	reg      *registry.Registry
	strategy *Strategy
	log      *slog.Logger
	stopTick chan struct{}
	reported map[string]bool // pools with a troupe_live_workers series

	// The wait queue (waitq.go): one queue per pool, the waiting jobs by
	// id, and the placements sent to queued jobs not yet answered by Took.
	queues  map[string]*waitQueue
	waiting map[string]*waiter
	handed  map[string]handoff
	seq     uint64
	// Gossip state (gossip.go).
	peers map[string]*peer
	dirty map[*registry.Worker]struct{}
	armed bool
	full  bool // the next report is a full one
	hello bool // the next report asks the others for theirs (Announce)
	// warned: workers warned about lately (checkPool); slowWarned: those
	// warned about as too slow for the TTL (cadence.go), and slowLogged
	// how many were named since slowPeriod began.
	warned     recentWarnings
	slowWarned recentWarnings
	slowPeriod time.Time
	slowLogged int
	// lastSweep is when the last sweep ran: a much longer gap means this
	// node was paused, and silence it did not hear proves nothing.
	lastSweep time.Time
	// reconnects is Link's reconnect count at the last sweep.
	reconnects uint64
	// Eviction by evidence (eviction.go): evicted workers by id with their
	// eviction time; the arrival of the latest heartbeat from any worker;
	// since when every worker has been silent (zero: not now).
	gone      evictedMemory
	lastHeard time.Time
	hushSince time.Time
	// stallAt is the latest sweep that saw the bus stalled (this node's
	// link down or re-established, or the hush); stallKept the workers
	// kept since as maybe still reconnecting (logged once each).
	stallAt   time.Time
	stallKept map[string]bool
	// heardMsgs is Heard's count at the last sweep; busAt the latest time
	// the bus is known to have carried messages to this node (the sweep
	// before the one that saw the count move: they came after it).
	heardMsgs uint64
	busAt     time.Time
	prevSweep time.Time // the last sweep that noted traffic
	// picks: slots counted for jobs that have not started on them nor
	// given them back (picks.go).
	picks map[string]pickRec
	// Stewardship and offers (stewards.go).
	offers    map[uint64]*offer
	offerSeq  uint64
	outOffers []Offer
	outAcks   []OfferAck
}

// handoff is a placement sent to a queued job, until the job's Took.
type handoff struct {
	w      *registry.Worker
	ticket uint64
	at     time.Time
}

// Props returns the router actor's props.
func Props(cfg Config) *actor.Props {
	cfg = cfg.withDefaults()
	var m *metrics
	if cfg.Metrics != nil {
		var err error
		if m, err = newMetrics(cfg.Metrics); err != nil {
			cfg.Log.Warn("router metrics disabled", "err", err)
			m = nil
		}
	}
	latest := &atomic.Pointer[PoolConfig]{}
	latest.Store(cfg.Pools)
	return actor.PropsFromProducer(func() actor.Actor {
		reg := registry.New(cfg.TTL)
		if err := reg.SetBounds(cfg.Bounds, cfg.Metrics); err != nil {
			cfg.Log.Warn("registry bound metrics disabled", "err", err)
		}
		st := NewStrategy(latest.Load(), reg, cfg.Direct, cfg.PoolSubj)
		st.staleRetries = cfg.StaleRetries
		if m != nil {
			st.onStale = m.countStale
		}
		now := cfg.Now
		if now == nil {
			now = time.Now
		}
		blind := &recentWarnings{every: WarnAgainEvery}
		st.onBlindDirect = func(w *registry.Worker, pool string) {
			if blind.due(w.ID, now()) {
				cfg.Log.Warn("pool "+pool+" forces direct dispatch, but this worker does not announce "+
					registry.LabelDispatch+"="+registry.DispatchDirect+" (stock CAP workers listen on the pool subject only); "+
					"its jobs go to the pool subject", "worker_id", w.ID, "pool", pool)
			}
		}
		return &Router{cfg: cfg, metrics: m, latest: latest, now: now,
			reg: reg, strategy: st, log: cfg.Log, reported: map[string]bool{},
			queues: map[string]*waitQueue{}, waiting: map[string]*waiter{}, handed: map[string]handoff{},
			peers: map[string]*peer{}, dirty: map[*registry.Worker]struct{}{}, offers: map[uint64]*offer{},
			warned: recentWarnings{every: WarnAgainEvery}, slowWarned: recentWarnings{every: SlowBeatWarnEvery},
			picks: map[string]pickRec{}}
	})
}

// Receive handles the router's messages.
func (r *Router) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		r.startSweeper(c)
		r.publish(true)
		r.peersChanged()
	case *actor.Stopping, *actor.Restarting:
		r.stopSweeper()
	case *HeartbeatSeen:
		if m.HB.GetWorkerId() == "" {
			return
		}
		known := r.reg.Get(m.HB.WorkerId) != nil
		r.heardAgain(m.At)
		w := r.reg.ObserveSent(m.HB, m.At, m.Sent)
		if w == nil { // refused by the registry's bounds (counted there)
			return
		}
		r.gone.forget(w.ID)
		r.cfg.Beats.heard(w.ID, m.Sent, r.reg.Window(w))
		r.checkCadence(w, m.At)
		if !known {
			r.joined(c, w)
			r.checkPool(w)
		}
		if r.reg.HasRoom(w) {
			r.drain(c, w.Pool)
		}
	case *PickRequest:
		r.pick(c, m)
	case *Took:
		h, ok := r.handed[m.JobID]
		if !ok || h.ticket != m.Ticket {
			if m.Used && m.WorkerID != "" {
				// Taken after the handoff had expired and its slot was
				// freed: the job dispatches there, so count it again.
				if w := r.reg.Get(m.WorkerID); w != nil && r.reg.Occupy(w, m.JobID) {
					r.changed(c, w)
					r.track(m.JobID, w)
				}
			}
			return
		}
		delete(r.handed, m.JobID)
		if !m.Used {
			r.vacate(c, h.w, m.JobID)
		} else {
			r.track(m.JobID, h.w)
		}
	case *Withdraw:
		if w := r.waiting[m.JobID]; w != nil && w.ticket == m.Ticket {
			r.unlink(w)
			r.tidy(w.pools)
		}
		if h, ok := r.handed[m.JobID]; ok && h.ticket == m.Ticket {
			delete(r.handed, m.JobID)
			r.vacate(c, h.w, m.JobID)
		}
	case *Released:
		r.confirmPick(m.JobID, m.WorkerID)
		w := r.reg.Get(m.WorkerID)
		if w == nil {
			return
		}
		switch {
		case m.Done && m.Linger && r.reg.Reconciles(w):
			r.reg.Linger(w, m.JobID, r.now().Add(registry.LingerFor))
		case m.Done:
			r.vacate(c, w, m.JobID)
		default:
			r.reg.Start(w, m.JobID, r.now())
		}
	case *Occupied:
		if m.Started {
			r.confirmPick(m.JobID, m.WorkerID)
		}
		w := r.reg.Get(m.WorkerID)
		if w == nil {
			r.occupiedLost(m)
			return
		}
		if r.reg.Occupy(w, m.JobID) {
			r.changed(c, w)
			if m.Started {
				r.reg.Start(w, m.JobID, r.now())
			} else {
				r.track(m.JobID, w)
			}
		}
	case *QueuePosition:
		c.Respond(r.position(m.JobID))
	case *FindWaiting:
		c.Respond(r.waitingView(m.JobID))
	case *ListPeers:
		c.Respond(r.peerIDs())
	case *ListWaiting:
		c.Respond(r.listWaiting(m.Tenant, m.Limit))
	case *PeerLoad:
		r.peerLoad(c, m)
	case gossipTick:
		r.armed = false
		r.publish(false)
	case *Announce:
		r.hello = true
		r.publish(true)
	case *SetPools:
		r.strategy.SetConfig(m.Config)
		r.latest.Store(m.Config)
		r.drainAll(c)
	case *ListWorkers:
		c.Respond(r.listWorkers())
	case *SnapshotRequest:
		now := r.now()
		c.Respond(&SnapshotReply{At: now, Workers: r.reg.Snapshot(now)})
	case *Hydrate:
		n := r.reg.Hydrate(m.Workers, r.now())
		r.log.Info("registry hydrated from snapshot", "workers", n, "in_snapshot", len(m.Workers))
		r.drainAll(c)
		if c.Sender() != nil {
			c.Respond(&Hydrated{Added: n})
		}
	case sweepTick:
		now := r.now()
		gap := now.Sub(r.lastSweep)
		paused := !r.lastSweep.IsZero() && gap > 2*r.cfg.SweepEach+time.Second
		r.lastSweep = now
		if paused {
			// This node did not run for a while (GC, SIGSTOP, a VM
			// migration): the heartbeats and reports it missed are only now
			// arriving, so silence proves nothing this round.
			r.log.Warn("router resumed after a pause; no eviction or replica expiry this round", "gap", gap)
			r.publish(true)
			return
		}
		if r.cfg.Link != nil {
			up, reconnects := r.cfg.Link()
			if !up || reconnects != r.reconnects {
				// This node was cut off from NATS: the heartbeats and
				// reports it missed were sent to nobody it could hear, and
				// the workers may be reconnecting too. Each worker's
				// silence counts from now.
				r.reconnects = reconnects
				r.stalled(now)
				n := r.reg.Reprieve(now)
				r.log.Warn("NATS connection down or re-established; no eviction or replica expiry this round, worker silence counts from now",
					"connected", up, "workers", n)
				r.publish(true)
				return
			}
		}
		r.noteTraffic(now)
		if r.sweep() {
			// Every worker went silent at once: the replicas' reports
			// cross the same bus, so their silence proves nothing either.
			r.stalled(now)
			r.expireHandoffs(c)
			r.expirePicks(c)
			r.publish(true)
			return
		}
		r.expirePeers(c)
		r.expireHandoffs(c)
		r.expirePicks(c)
		r.expireOffers(c)
		r.publish(true)
	}
}

// checkPool warns, once per worker per WarnAgainEvery, about a heartbeat that no topic can
// route to: its pool is named by no topic of the config. A common slip is
// announcing the topic (job.echo) as the pool; its jobs would otherwise
// wait no_workers with nothing saying why.
func (r *Router) checkPool(w *registry.Worker) {
	cfg := r.strategy.Config()
	if cfg == nil || len(cfg.Topics) == 0 || r.strategy.Routed(w.Pool) || !r.warned.due(w.ID, r.now()) {
		return
	}
	hint := ""
	if pools, ok := cfg.Topics[w.Pool]; ok {
		hint = "; " + w.Pool + " is a topic, routed to pool(s) " + strings.Join(pools, ",") +
			": the heartbeat's pool must be the pool's name"
	}
	r.log.Warn("worker heartbeats a pool no topic routes to; it will get no jobs"+hint,
		"worker_id", w.ID, "pool", w.Pool)
}

// sweep evicts the workers past their window that silence shows gone
// (hold keeps the others) and reports whether the sweep is hushed: some
// stale worker held because every worker went silent at once.
func (r *Router) sweep() bool {
	now := r.now()
	r.gone.expire(now.Add(-EvictedMemory))
	r.forgetWarnings(now)
	hushed := false
	gone := r.reg.SweepExcept(now, func(w *registry.Worker) bool {
		h := r.hold(w, now)
		hushed = hushed || h
		return h || r.reconnecting(w, now)
	})
	for _, w := range gone {
		r.gone.add(w.ID, now)
		r.cfg.Beats.evicted(w.ID)
		r.log.Info("worker evicted", "worker_id", w.ID, "pool", w.Pool, "last_seen", w.LastSeen)
		if r.metrics != nil {
			r.metrics.evicted.WithLabelValues(w.Pool).Inc()
		}
		if r.cfg.OnEvict != nil {
			r.cfg.OnEvict(w.ID)
		}
		if ids := r.reg.Jobs(w); len(ids) > 0 && r.cfg.OnEvictJobs != nil {
			r.cfg.OnEvictJobs(w.ID, ids, now)
		}
		delete(r.dirty, w)
	}
	if r.metrics == nil {
		return hushed
	}
	live := r.reg.LivePerPool(now)
	unrouted := 0
	for p, n := range live {
		if !r.strategy.Routed(p) {
			unrouted += n
		}
	}
	r.metrics.unrouted.Set(float64(unrouted))
	// Pools that lost their last worker, and configured pools with none,
	// report 0 rather than vanish, so an empty pool is visible.
	for p := range r.reported {
		if _, ok := live[p]; !ok {
			live[p] = 0
		}
	}
	if cfg := r.strategy.Config(); cfg != nil {
		for p := range cfg.Pools {
			if _, ok := live[p]; !ok {
				live[p] = 0
			}
		}
	}
	slow := r.reg.TooSlowPerPool(now)
	for p, n := range live {
		r.metrics.live.WithLabelValues(p).Set(float64(n))
		r.metrics.tooSlow.WithLabelValues(p).Set(float64(slow[p]))
		r.reported[p] = true
	}
	return hushed
}

func (r *Router) listWorkers() []WorkerInfo {
	now := r.now()
	out := make([]WorkerInfo, 0, r.reg.Len())
	for _, p := range r.reg.Pools() {
		for _, w := range r.reg.Pool(p) {
			if !r.reg.Live(w, now) {
				continue
			}
			out = append(out, WorkerInfo{ID: w.ID, Pool: w.Pool, ActiveJobs: w.ActiveJobs, Dispatched: w.Dispatched,
				InFlight: w.InFlight(), Others: w.Others, Foreign: w.Foreign, Steward: r.stewardOf(w.ID),
				Routed:      r.strategy.Routed(w.Pool),
				MaxParallel: w.MaxParallel, CPULoad: w.CPULoad, GPUUtil: w.GPUUtil, Direct: w.Direct,
				LastSeen: w.LastSeen, Labels: w.Labels, Interval: w.Interval, TooSlow: r.reg.TooSlow(w)})
		}
	}
	slices.SortFunc(out, func(a, b WorkerInfo) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// startSweeper ticks from a goroutine of its own: the actor must not block,
// and Root.Send is the one thing that goroutine does with the system.
func (r *Router) startSweeper(c actor.Context) {
	r.stopTick = make(chan struct{})
	self, root, stop, every := c.Self(), c.ActorSystem().Root, r.stopTick, r.cfg.SweepEach
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

func (r *Router) stopSweeper() {
	if r.stopTick != nil {
		close(r.stopTick)
		r.stopTick = nil
	}
}
