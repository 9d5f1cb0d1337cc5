package supervisor

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/jobactor"
)

// Resolver settles results and cancels for jobs this node does not run
// without a job actor. With replicas, most results reach a node other than
// the one that dispatched the job (they share the result stream): spawning
// an actor there, running the activation script only to learn that the lock
// is another node's, and stopping the actor again cost more than the
// forward itself. The shard hands such an event — no live actor, not parked
// here — to the Resolver, which reads the job's lock (one pipelined GET per
// batch of events) and, when another node holds it unparked, forwards the
// event to that node and settles the delivery by its answer: the events of
// one batch that go to one owner go in one request (ForwardBatch), and each
// delivery is settled by its own event's outcome. Anything else
// (no lock, this node's own, a parked lock whose lease must be checked, a
// Redis error) goes back to the shard, which spawns the actor as before.
type Resolver struct {
	node     string
	holders  func(ctx context.Context, ids []string) ([]string, error)
	batch    func(owner string, items []ForwardItem) []error
	counted  *prometheus.CounterVec // outcome: taken, returned
	remain   func(ctx context.Context, jobID string) (time.Duration, error)
	lockTTL  time.Duration
	root     *actor.RootContext
	log      *slog.Logger
	reqs     chan resolveReq
	stop     chan struct{}
	resolved prometheus.Counter
}

// ForwardItem is one event of a batch forward: its kind
// (jobactor.ForwardResult, jobactor.ForwardCancel) and its packet.
type ForwardItem struct {
	Kind string
	Raw  []byte
}

type resolveReq struct {
	shard *actor.PID
	d     *Deliver
}

// resolveBatch bounds the events one lock read covers.
const resolveBatch = 256

// ResolverConfig configures a Resolver.
type ResolverConfig struct {
	NodeID string
	// Holders reads the lock values of jobs (store.Store.LockHolders).
	Holders func(ctx context.Context, ids []string) ([]string, error)
	// ForwardBatch passes several events to one owner: an error per item,
	// nil for each it took (intake.BatchForwarder, which sends a lone event
	// in the single form).
	ForwardBatch func(owner string, items []ForwardItem) []error
	// Forwarded counts forwards by outcome (jobactor.Metrics.Forwarded).
	Forwarded *prometheus.CounterVec
	// OwnerWait and LockTTL set how long an event whose forward failed
	// waits to be offered again (jobactor.ForwardRetryDelay).
	OwnerWait func(ctx context.Context, jobID string) (time.Duration, error)
	LockTTL   time.Duration
	Root      *actor.RootContext
	Log       *slog.Logger
	// Registerer gets troupe_events_forwarded_unspawned_total (nil: none).
	Registerer prometheus.Registerer
}

// NewResolver starts a Resolver; Stop ends it.
func NewResolver(cfg ResolverConfig) *Resolver {
	r := &Resolver{node: cfg.NodeID, holders: cfg.Holders, batch: cfg.ForwardBatch,
		counted: cfg.Forwarded,
		remain:  cfg.OwnerWait, lockTTL: cfg.LockTTL,
		root: cfg.Root, log: cfg.Log, reqs: make(chan resolveReq, 4*resolveBatch), stop: make(chan struct{}),
		resolved: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_events_forwarded_unspawned_total",
			Help: "Results and cancels forwarded to the node owning their job straight from a lock read, with no job actor."})}
	if cfg.Registerer != nil {
		_ = cfg.Registerer.Register(r.resolved)
	}
	go r.loop()
	return r
}

// Stop ends the Resolver's goroutine; events still queued go back to their
// shards.
func (r *Resolver) Stop() { close(r.stop) }

// forwardable reports whether msg is an event a Resolver may forward: a
// result or cancel taken from its stream (not one forwarded to this node,
// which is never forwarded again), with its packet.
func forwardable(msg any) (kind string, raw []byte, d jobactor.Delivery, ok bool) {
	switch m := msg.(type) {
	case *jobactor.Result:
		if !m.Forwarded && m.Raw != nil && m.Delivery != nil {
			return jobactor.ForwardResult, m.Raw, m.Delivery, true
		}
	case *jobactor.Cancel:
		if !m.Forwarded && m.Raw != nil && m.Delivery != nil {
			return jobactor.ForwardCancel, m.Raw, m.Delivery, true
		}
	}
	return "", nil, nil, false
}

// ask queues d (from shard) for resolving; false when the queue is full
// (the shard then spawns the actor as usual).
func (r *Resolver) ask(shard *actor.PID, d *Deliver) bool {
	select {
	case r.reqs <- resolveReq{shard: shard, d: d}:
		return true
	default:
		return false
	}
}

func (r *Resolver) loop() {
	batch := make([]resolveReq, 0, resolveBatch)
	ids := make([]string, 0, resolveBatch)
	for {
		select {
		case <-r.stop:
			r.drain()
			return
		case q := <-r.reqs:
			batch = append(batch[:0], q)
		}
	fill:
		for len(batch) < resolveBatch {
			select {
			case q := <-r.reqs:
				batch = append(batch, q)
			default:
				break fill
			}
		}
		ids = ids[:0]
		for _, q := range batch {
			ids = append(ids, q.d.JobID)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		holders, err := r.holders(ctx, ids)
		cancel()
		var owners map[string][]forwarding
		for i, q := range batch {
			owner := ""
			if err == nil {
				owner = r.foreignOwner(holders[i])
			}
			if owner == "" {
				r.back(q)
				continue
			}
			kind, raw, d, _ := forwardable(q.d.Msg)
			r.resolved.Inc()
			if owners == nil {
				owners = make(map[string][]forwarding)
			}
			owners[owner] = append(owners[owner], forwarding{id: q.d.JobID, item: ForwardItem{Kind: kind, Raw: raw}, d: d})
		}
		for owner, fs := range owners {
			go r.forwardTo(owner, fs)
		}
		clear(batch)
	}
}

// forwarding is one event of a batch on its way to its owner.
type forwarding struct {
	id   string
	item ForwardItem
	d    jobactor.Delivery
}

// forwardTo forwards fs to owner in one request and settles each delivery by its own event's outcome: acked when the
// owner took it, handed back to JetStream otherwise (after
// jobactor.ForwardRetryDelay, which may read the lock: concurrently, so one
// slow read holds no other event).
func (r *Resolver) forwardTo(owner string, fs []forwarding) {
	items := make([]ForwardItem, len(fs))
	for i, f := range fs {
		items[i] = f.item
	}
	errs := r.batch(owner, items)
	for i, f := range fs {
		if errs[i] == nil {
			r.counted.WithLabelValues("taken").Inc()
			_ = f.d.Ack()
			continue
		}
		r.counted.WithLabelValues("returned").Inc()
		go func(f forwarding, err error) {
			_ = f.d.NakWithDelay(jobactor.ForwardRetryDelay(err, r.remain, r.lockTTL, f.id))
		}(f, errs[i])
	}
}

// foreignOwner is the node holding lock when it is another node's and not
// parked ("<node>|<fence>"); "" otherwise.
func (r *Resolver) foreignOwner(lock string) string {
	if lock == "" || strings.HasSuffix(lock, "|p") {
		return ""
	}
	owner, _, ok := strings.Cut(lock, "|")
	if !ok || owner == "" || owner == r.node {
		return ""
	}
	return owner
}

// back returns an event to its shard, to be handled by a job actor.
func (r *Resolver) back(q resolveReq) {
	r.root.Send(q.shard, &Deliver{JobID: q.d.JobID, Msg: q.d.Msg, Spawn: q.d.Spawn, resolved: true})
}

func (r *Resolver) drain() {
	for {
		select {
		case q := <-r.reqs:
			r.back(q)
		default:
			return
		}
	}
}
