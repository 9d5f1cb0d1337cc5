// Package jobtrace records, per live job actor, every message its mailbox
// delivers — when, from whom, of what type, the job's state before and after
// and the reason the actor gives — in a bounded ring, and persists the ring
// to Redis beside the job's record when the actor stops, so `troupe trace`
// can show a job's mailbox long after its actor is gone.
//
// Tracing is a receiver middleware on the job actors' props, installed only
// when tracing is on. Off means no middleware at all — not a middleware that
// checks a flag — because any receiver middleware makes protoactor wrap
// every message in an envelope and build each actor's context extras
// (protoactor's receive middleware). A nil *Tracer is tracing off: its
// PropsOptions are empty and its other methods are no-ops.
//
// Wiring (the node does it):
//
//	tr, err := jobtrace.New(sys, jobtrace.Config{Enabled: true, Redis: rdb, Keys: keys, NodeID: id})
//	props := actor.PropsFromProducer(newJob, tr.PropsOptions()...)
//	...
//	tr.Close() // after the job actors have stopped: flushes the last rings
package jobtrace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/extensions"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/store"
)

// Defaults for Config fields left zero.
const (
	// RingSizeDefault entries are kept per live job. A job on the happy path
	// receives about ten messages (lifecycle, submit, store replies, router
	// reply, result); 64 keeps a job that retried a few times whole, and the
	// ring only grows to its size when a job needs it.
	RingSizeDefault = 64
	// PersistMaxDefault entries are kept per job in Redis, across all its
	// activations (passivation, restarts, adoption by another node): the
	// newest win.
	PersistMaxDefault = 1024
	// OpenTTLDefault is how long the trace of a job that was not terminal
	// when its actor stopped (passivated for approval, node shutdown) is
	// kept. Its record has no TTL yet; the trace gets a long one so that a
	// job finished by a replica without tracing does not leave it forever.
	OpenTTLDefault = 7 * 24 * time.Hour
	// QueueDefault persists may wait for the writer. A full queue drops the
	// trace (counted) rather than block a job actor on Redis.
	QueueDefault = 4096
	// writeBatch rings go to Redis in one pipeline.
	writeBatch = 64
	// writeTimeout bounds one pipeline.
	writeTimeout = 5 * time.Second
)

// StateReporter is implemented by an actor whose state the trace records:
// the job's state and the reason of its latest transition, as plain strings
// (the actor's own types need not leak into this package). It is called on
// the actor's goroutine just before and just after each message, so it must
// be cheap and must not allocate.
type StateReporter interface {
	TraceState() (state, reason string)
}

// Config configures a Tracer.
type Config struct {
	// Enabled turns tracing on. Off, New returns a nil *Tracer.
	Enabled bool
	// RingSize bounds the entries kept per live job (default RingSizeDefault).
	RingSize int
	// Redis and Keys are where rings are persisted (list Keys.Trace(job)).
	// Without Redis the rings live in memory only (benchmarks, tests).
	Redis redis.UniversalClient
	Keys  *store.Keys
	// Retention is the TTL of a terminal job's trace, as the store keeps
	// its record (default store.RetentionDefault; < 0 keeps it forever).
	Retention time.Duration
	// OpenTTL is the TTL of a non-terminal job's trace (default OpenTTLDefault).
	OpenTTL time.Duration
	// PersistMax bounds the entries kept per job in Redis (default PersistMaxDefault).
	PersistMax int64
	// Queue bounds the rings waiting to be written (default QueueDefault).
	Queue int
	// NodeID is recorded on every entry: a job may run on several replicas.
	NodeID string
	// JobID names the job of an actor (default: the last segment of its
	// PID id, "jobs-3/job-42" → "job-42").
	JobID func(self *actor.PID) string
	// Origin names who sent a message that came without a sender PID
	// (protoactor's Send carries none): for example "intake" for a submit,
	// "store" for a write's outcome. Optional; nil leaves the sender empty.
	Origin func(msg interface{}) string
	// Log receives write failures (default slog.Default()).
	Log *slog.Logger
	// Metrics, when set, gets the tracer's counters.
	Metrics prometheus.Registerer
}

// Entry is one message a job's mailbox delivered.
type Entry struct {
	At   time.Time `json:"at"`
	Node string    `json:"node,omitempty"`
	// Activation identifies the actor incarnation (its start, unix ns) and
	// Seq the message within it; together with Node they identify an entry.
	Activation int64  `json:"activation"`
	Seq        uint64 `json:"seq"`
	Sender     string `json:"sender,omitempty"`
	Type       string `json:"type"`
	Before     string `json:"before,omitempty"`
	After      string `json:"after,omitempty"`
	Reason     string `json:"reason,omitempty"`
	// HandleNanos is how long the actor took over the message.
	HandleNanos int64 `json:"handle_ns"`
	// Panicked marks a message whose handling panicked (supervision
	// restarts or stops the actor next).
	Panicked bool `json:"panicked,omitempty"`
	// Dropped counts entries of this activation lost before this one when
	// the ring wrapped.
	Dropped uint64 `json:"dropped,omitempty"`
	// Live marks an entry still in a live actor's ring (not yet persisted).
	Live bool `json:"live,omitempty"`
}

// Tracer records job actors' mailboxes. A nil *Tracer is tracing off.
type Tracer struct {
	// Immutable after New.
	cfg     Config
	log     *slog.Logger
	metrics tracerMetrics

	// live maps a job id to the ring of its live actor, for readers; the
	// actor itself reaches its ring through its context extension.
	live sync.Map // string → *ring

	// pending holds rings handed to the writer and not yet in Redis, so a
	// reader never misses the window between an actor's stop and the write.
	pendingMu sync.Mutex
	pending   map[string][]*segment

	queue     chan *segment
	closeOnce sync.Once
	closing   chan struct{}
	done      chan struct{}
	rings     atomic.Int64
}

// extensionID finds a Tracer among its actor system's extensions.
var extensionID = extensions.NextExtensionID()

// ExtensionID implements extensions.Extension.
func (t *Tracer) ExtensionID() extensions.ExtensionID { return extensionID }

// New returns a Tracer for the job actors of sys, or nil when cfg is not
// Enabled. The Tracer registers itself as an extension of sys (FromSystem
// finds it) and starts its writer when Redis is set.
func New(sys *actor.ActorSystem, cfg Config) (*Tracer, error) {
	if !cfg.Enabled {
		return nil, nil
	}
	if cfg.Redis != nil && cfg.Keys == nil {
		return nil, errors.New("jobtrace: Redis needs Keys")
	}
	if cfg.RingSize <= 0 {
		cfg.RingSize = RingSizeDefault
	}
	if cfg.Retention == 0 {
		cfg.Retention = store.RetentionDefault
	}
	if cfg.OpenTTL <= 0 {
		cfg.OpenTTL = OpenTTLDefault
	}
	if cfg.PersistMax <= 0 {
		cfg.PersistMax = PersistMaxDefault
	}
	if cfg.Queue <= 0 {
		cfg.Queue = QueueDefault
	}
	if cfg.JobID == nil {
		cfg.JobID = lastSegment
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	t := &Tracer{cfg: cfg, log: cfg.Log.With("component", "jobtrace"), pending: map[string][]*segment{},
		queue: make(chan *segment, cfg.Queue), closing: make(chan struct{}), done: make(chan struct{})}
	t.metrics = newMetrics(cfg.Metrics, &t.rings)
	if sys != nil {
		sys.Extensions.Register(t)
	}
	if cfg.Redis != nil {
		go t.writer()
	} else {
		close(t.done)
	}
	return t, nil
}

// FromSystem returns the Tracer registered with sys, or nil (tracing off).
func FromSystem(sys *actor.ActorSystem) *Tracer {
	if sys == nil {
		return nil
	}
	t, _ := sys.Extensions.Get(extensionID).(*Tracer)
	return t
}

func lastSegment(self *actor.PID) string {
	id := self.GetId()
	if i := strings.LastIndexByte(id, '/'); i >= 0 {
		return id[i+1:]
	}
	return id
}

// PropsOptions returns the props options that install tracing: none at all
// for a nil Tracer.
func (t *Tracer) PropsOptions() []actor.PropsOption {
	if t == nil {
		return nil
	}
	return []actor.PropsOption{actor.WithReceiverMiddleware(t.Middleware())}
}

// Middleware returns the receiver middleware that records each message
// (nil for a nil Tracer: install nothing).
func (t *Tracer) Middleware() actor.ReceiverMiddleware {
	if t == nil {
		return nil
	}
	return func(next actor.ReceiverFunc) actor.ReceiverFunc {
		return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
			r := t.ringOf(c)
			var before string
			if sr, ok := c.Actor().(StateReporter); ok {
				before, _ = sr.TraceState()
			}
			start := time.Now()
			// A message that makes the actor panic is the one an operator
			// most wants to see: record it on the way out, then let the
			// panic go on to supervision.
			panicked := true
			defer func() {
				if panicked {
					t.record(c, r, env, start, before, true)
				}
			}()
			next(c, env)
			panicked = false
			t.record(c, r, env, start, before, false)
			if _, ok := env.Message.(*actor.Stopped); ok {
				t.stopped(r)
			}
		}
	}
}

func (t *Tracer) record(c actor.ReceiverContext, r *ring, env *actor.MessageEnvelope, start time.Time, before string,
	panicked bool) {
	rec := record{at: start.UnixNano(), took: int64(time.Since(start)), sender: env.Sender,
		typ: reflect.TypeOf(env.Message), before: before, panicked: panicked}
	if rec.sender == nil && t.cfg.Origin != nil {
		rec.origin = t.cfg.Origin(env.Message)
	}
	// After a restart Actor() is the new instance: ask it, not the one
	// that handled the message.
	if sr, ok := c.Actor().(StateReporter); ok {
		rec.after, rec.reason = sr.TraceState()
	}
	r.add(rec)
}

// ringOf returns the actor's ring, creating it on the actor's first message.
func (t *Tracer) ringOf(c actor.ReceiverContext) *ring {
	if r, ok := c.Get(ringExtensionID).(*ring); ok {
		return r
	}
	r := newRing(t.cfg.JobID(c.Self()), t.cfg.NodeID, t.cfg.RingSize)
	c.Set(r)
	t.live.Store(r.jobID, r)
	t.rings.Add(1)
	return r
}

// stopped hands a stopped actor's ring to the writer.
func (t *Tracer) stopped(r *ring) {
	seg := &segment{jobID: r.jobID, entries: r.entries(false), terminal: r.terminal()}
	if t.cfg.Redis != nil {
		// Pending before the live entry goes: a reader looks in live,
		// then pending, then Redis, and must find the entries in one.
		t.addPending(seg)
		why := ""
		select {
		case <-t.closing:
			why = "tracer closed"
		default:
			select {
			case t.queue <- seg:
			default:
				why = "persist queue full"
			}
		}
		if why != "" {
			t.removePending(seg)
			t.metrics.dropped.Inc()
			t.log.Warn("job trace dropped", "job_id", r.jobID, "why", why, "entries", len(seg.entries))
		}
	}
	t.live.CompareAndDelete(r.jobID, r)
	t.rings.Add(-1)
}

// Live returns the entries in jobID's live ring on this node, if it has one.
func (t *Tracer) Live(jobID string) ([]Entry, bool) {
	if t == nil {
		return nil, false
	}
	v, ok := t.live.Load(jobID)
	if !ok {
		return nil, false
	}
	return v.(*ring).entries(true), true
}

// Trace returns every entry known for jobID, oldest activation first: the
// persisted ones, those waiting to be written, then the live ring's.
func (t *Tracer) Trace(ctx context.Context, jobID string) ([]Entry, error) {
	if t == nil {
		return nil, errors.New("jobtrace: tracing is off")
	}
	live, _ := t.Live(jobID)
	pending := t.pendingOf(jobID)
	var persisted []Entry
	if t.cfg.Redis != nil {
		var err error
		if persisted, err = Load(ctx, t.cfg.Redis, t.cfg.Keys, jobID); err != nil {
			return nil, err
		}
	}
	return merge(persisted, pending, live), nil
}

// merge concatenates entry lists, keeping the first copy of an entry seen
// in several (a ring persisted while it was being read).
func merge(lists ...[]Entry) []Entry {
	type key struct {
		node string
		act  int64
		seq  uint64
	}
	seen := map[key]bool{}
	var out []Entry
	for _, l := range lists {
		for _, e := range l {
			k := key{e.Node, e.Activation, e.Seq}
			if seen[k] {
				continue
			}
			seen[k] = true
			out = append(out, e)
		}
	}
	return out
}

// Close writes the rings already handed over and stops the writer. Call it
// after the job actors have stopped; rings of actors stopping later are
// dropped (counted).
func (t *Tracer) Close() {
	if t == nil {
		return
	}
	t.closeOnce.Do(func() { close(t.closing) })
	<-t.done
}

// Load reads a job's persisted trace, oldest first.
func Load(ctx context.Context, rdb redis.UniversalClient, keys *store.Keys, jobID string) ([]Entry, error) {
	raw, err := rdb.LRange(ctx, keys.Trace(jobID), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("jobtrace: read %s: %w", jobID, err)
	}
	out := make([]Entry, 0, len(raw))
	for _, s := range raw {
		e, err := decodeEntry(s)
		if err != nil {
			// One bad element must not hide the rest of the trace.
			continue
		}
		out = append(out, e)
	}
	return out, nil
}
