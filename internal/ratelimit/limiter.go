package ratelimit

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// Defaults of the limiter.
const (
	// MinIntervalDefault bounds how often one node calls one bucket's
	// script while jobs wait on it: at most 1/MinInterval calls a second a
	// bucket a node (50), whatever the number of waiting jobs. Shorter
	// makes grants smoother at high rates and costs Redis commands.
	MinIntervalDefault = 20 * time.Millisecond
	// MaxInterval bounds the wait between two calls while jobs wait, however
	// long the bucket says its next token takes: another replica may give
	// tokens back, or Redis lose the bucket (it then starts full).
	MaxInterval = time.Second
	// CallTimeout bounds one script call.
	CallTimeout = 2 * time.Second
	// ErrorBackoffMax caps the wait between calls while Redis fails.
	ErrorBackoffMax = time.Second
	// DynamicIdle: a template's key bucket with no waiter and no ask for
	// this long is dropped from the node's memory (its Redis key expires
	// once full); a later job of the key makes it again.
	DynamicIdle = time.Minute
	// stateLostWithin: a bucket's key absent this soon after this node's
	// last call cannot have expired (its expiry is a minute past full): Redis
	// lost it.
	stateLostWithin = 50 * time.Second
)

// Answer is how Take answers at once.
type Answer uint8

const (
	// Granted: the units are the job's now.
	Granted Answer = iota
	// Pending: the job is queued; notify will say granted, or, after the
	// first call that could not grant it, not granted (it waits on).
	Pending
	// Queued: the job was queued already (asked again); it waits on and
	// notify will say granted.
	Queued
	// Unknown: no such bucket on this node, or units beyond its burst (a
	// pools reload removed it or cut its burst): never grantable.
	Unknown
)

// Limiter is the node's component for rate limit buckets. For each
// declared bucket it keeps the node's waiting jobs in one FIFO queue and
// one goroutine that, while the queue is not empty, calls the bucket's
// script once per refill (never more often than MinInterval) for all the
// waiters' units, and hands the tokens out in queue order: a job is
// granted only once every job queued before it on this node has been.
// Tokens granted beyond the head's need stay with the node (its credit)
// for the next job. What it never does: a Redis command per job, or a
// grant out of queue order on one node.
//
// Fairness across replicas: each node asks for all of its waiters' units;
// Redis grants whole tokens to the calls in the order they arrive. Every
// node with waiters calls once per refill, so the tokens of a refill go
// to the node that asks first after it, and over time to the nodes in
// proportion to how often they ask, not to how many jobs they hold.
//
// Apply (a pools reload) replaces the declared buckets while jobs wait: a
// kept bucket takes its new limit and burst (Redis's level carries over,
// clamped to the new burst by the next call); a new one gets its queue and
// goroutine; the waiters of a removed bucket, and those asking for more
// units than a cut burst holds, are told it will never grant them.
type Limiter struct {
	// Immutable after New.
	store       *Store
	node        string
	log         *slog.Logger
	m           *Metrics
	minInterval time.Duration

	// mu guards spec, queues and ctx (Apply replaces them; every other
	// method reads them).
	mu     sync.RWMutex
	spec   *Spec
	queues map[string]*queue
	// live counts each template's key buckets in queues (bounded by its
	// MaxKeys: ForJob sends a new key past it to the overflow bucket).
	live map[string]int
	ctx  context.Context // set by Start: a bucket added later runs under it
	// idle: DynamicIdle (tests shorten it).
	idle time.Duration

	// Set by Start, read by Stop.
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// queue is one bucket's waiters on this node; mu guards everything below
// it (b too: Apply replaces it).
type queue struct {
	mu    sync.Mutex
	b     *Bucket
	order *list.List // of *waiter, oldest first
	byJob map[string]*list.Element
	units int // the waiters' units in all
	// credit: tokens taken from Redis and not yet handed to a job.
	credit   int
	level    float64
	lastCall time.Time
	wake     chan struct{}
	// stop ends the bucket's goroutine; gone: Apply removed the bucket, or
	// (a key's bucket) it was dropped idle.
	stop context.CancelFunc
	gone bool
	// of: a key's bucket's template ("": a declared bucket); used: the
	// last ask (Take) of a key's bucket.
	of   string
	used time.Time
}

// label is the bucket's metrics label: a key's bucket counts under its
// template (the keys are unbounded input; the gauges are the declared
// buckets' only).
func (q *queue) label() string {
	if q.of != "" {
		return q.of
	}
	return q.b.Name
}

type waiter struct {
	job    string
	epoch  uint64
	units  int
	since  time.Time
	told   bool
	notify Notify
}

// Notify is a job's later answer: granted, or not yet (it waits on); or,
// with problem set, never (its bucket was removed or its burst cut below
// the job's units by a pools reload): the job is out of the queue. It is
// called from another goroutine and must not block.
type Notify func(granted bool, problem string)

// Config builds a Limiter.
type Config struct {
	Spec   *Spec
	Store  *Store
	NodeID string
	Log    *slog.Logger
	// Metrics: nil, unregistered ones.
	Metrics *Metrics
	// MinInterval: 0, MinIntervalDefault.
	MinInterval time.Duration
	// Idle: 0, DynamicIdle.
	Idle time.Duration
}

// New returns a limiter for the declared buckets (Start runs it).
func New(c Config) *Limiter {
	l := &Limiter{spec: c.Spec, store: c.Store, node: c.NodeID, log: c.Log, m: c.Metrics,
		minInterval: c.MinInterval, queues: map[string]*queue{}, live: map[string]int{}, idle: c.Idle}
	if l.idle <= 0 {
		l.idle = DynamicIdle
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	if l.m == nil {
		l.m, _ = NewMetrics(nil)
	}
	if l.minInterval <= 0 {
		l.minInterval = MinIntervalDefault
	}
	l.spec = c.Spec
	if c.Spec != nil {
		for name, b := range c.Spec.Buckets {
			l.queues[name] = newQueue(b)
		}
	}
	return l
}

func newQueue(b *Bucket) *queue {
	return &queue{b: b, order: list.New(), byJob: map[string]*list.Element{}, level: float64(b.Burst),
		wake: make(chan struct{}, 1)}
}

// Spec is the declared buckets (the last applied).
func (l *Limiter) Spec() *Spec {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.spec
}

// ForJob is the declared buckets' ForJob (the last applied): the job core's
// Config.RateLimit. With no bucket declared a job's labels are ignored, as
// on a node that never declared any.
func (l *Limiter) ForJob(req *capv1.JobRequest) (bucket string, units int, problem string) {
	s := l.Spec()
	if s.Empty() {
		return "", 0, ""
	}
	bucket, units, problem = s.ForJob(req)
	if bucket == "" || s.Buckets[bucket] != nil {
		return bucket, units, problem
	}
	// A template's key bucket: a new key past the template's MaxKeys
	// shares the overflow bucket.
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.queues[bucket] != nil {
		return bucket, units, ""
	}
	if b := s.Resolve(bucket); b != nil && b.Of != "" && l.live[b.Of] >= b.MaxKeys {
		l.m.Overflow.WithLabelValues(b.Of).Inc()
		return OverflowOf(s.Templates[b.Of]), units, ""
	}
	return bucket, units, ""
}

// queue is bucket's queue (nil: none).
func (l *Limiter) queue(bucket string) *queue {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.queues[bucket]
}

// take is bucket's queue for an ask: a declared bucket's, or a template's
// key bucket's, made on its first use (nil: neither is declared).
func (l *Limiter) take(bucket string) *queue {
	if q := l.queue(bucket); q != nil {
		return q
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.queues[bucket]; q != nil {
		return q
	}
	b := l.spec.Resolve(bucket)
	if b == nil || b.Of == "" {
		return nil
	}
	q := newQueue(b)
	q.of, q.used = b.Of, time.Now()
	l.queues[bucket] = q
	l.live[b.Of]++
	if l.ctx != nil {
		l.startQueue(q)
	}
	return q
}

// Start starts one goroutine per bucket.
func (l *Limiter) Start(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ctx, l.cancel = context.WithCancel(context.WithoutCancel(ctx))
	for _, q := range l.queues {
		l.startQueue(q)
	}
	return nil
}

// startQueue starts q's goroutine (l.mu held, after Start).
func (l *Limiter) startQueue(q *queue) {
	var ctx context.Context
	ctx, q.stop = context.WithCancel(l.ctx)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.run(ctx, q)
	}()
}

// Apply makes spec the declared buckets (a pools reload; nil: none). A
// bucket kept by name takes its new limit, period and burst at its next
// call: Redis's level carries over, clamped to the new burst, and this
// node's credit is clamped too. A new bucket starts (full, unless Redis
// still holds its level). The waiters of a removed bucket, and a kept
// bucket's waiters asking for more units than its new burst, leave its
// queue and are told never (Notify's problem). It returns how many waiters
// were told so.
func (l *Limiter) Apply(spec *Spec) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.spec = spec
	told := 0
	for name, q := range l.queues {
		b := spec.Resolve(name)
		q.mu.Lock()
		if b != nil && b.Of != q.of { // a key's bucket now declared itself, or back to its template
			if q.of != "" {
				l.live[q.of]--
			}
			if q.of = b.Of; q.of != "" {
				l.live[q.of]++
			}
		}
		if b == nil {
			told += l.dropWaiters(q, func(*waiter) bool { return true },
				fmt.Sprintf("rate limit bucket %q is no longer declared (pools reload)", name))
			q.credit, q.gone = 0, true
			if q.stop != nil {
				q.stop()
			}
			delete(l.queues, name)
			if q.of != "" {
				l.live[q.of]--
			} else {
				l.m.Waiting.DeleteLabelValues(name)
				l.m.Level.DeleteLabelValues(name)
			}
		} else {
			q.b = b
			q.credit = min(q.credit, b.Burst)
			told += l.dropWaiters(q, func(w *waiter) bool { return w.units > b.Burst },
				fmt.Sprintf("rate limit bucket %q's burst is now %d (pools reload): never grantable", name, b.Burst))
			l.handOut(q)
			select {
			case q.wake <- struct{}{}:
			default:
			}
		}
		q.mu.Unlock()
	}
	if spec != nil {
		for name, b := range spec.Buckets {
			if l.queues[name] == nil {
				q := newQueue(b)
				l.queues[name] = q
				if l.ctx != nil {
					l.startQueue(q)
				}
			}
		}
	}
	return told
}

// dropWaiters takes the waiters that drop says out of q's queue and tells
// them why they will never be granted (q.mu held).
func (l *Limiter) dropWaiters(q *queue, drop func(*waiter) bool, why string) int {
	n := 0
	for e := q.order.Front(); e != nil; {
		next := e.Next()
		if w := e.Value.(*waiter); drop(w) {
			q.remove(e)
			w.notify(false, why)
			n++
		}
		e = next
	}
	if n > 0 {
		l.setWaiting(q)
	}
	return n
}

// Stop stops the goroutines; waiting jobs are not told (their actors stop
// with the node, and their records say they wait).
func (l *Limiter) Stop(ctx context.Context) error {
	if l.cancel != nil {
		l.cancel()
	}
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Take asks for units of bucket for job, under epoch (the job's ask: a
// later ask replaces it and keeps the job's place). notify is called, at
// most once per answer, from another goroutine, and must not block.
func (l *Limiter) Take(job, bucket string, units int, epoch uint64, notify Notify) Answer {
	q := l.take(bucket)
	if q == nil {
		return Unknown
	}
	q.mu.Lock()
	if q.gone && q.of != "" {
		// A key's bucket dropped idle since the lookup: make it again.
		q.mu.Unlock()
		if q = l.take(bucket); q == nil {
			return Unknown
		}
		q.mu.Lock()
	}
	defer q.mu.Unlock()
	if q.gone || units > q.b.Burst {
		return Unknown
	}
	if q.of != "" {
		q.used = time.Now()
	}
	if e := q.byJob[job]; e != nil {
		w := e.Value.(*waiter)
		w.epoch, w.notify = epoch, notify
		if w.told {
			return Queued
		}
		return Pending
	}
	if q.order.Len() == 0 && q.credit >= units {
		q.credit -= units
		l.m.Granted.WithLabelValues(q.label()).Add(float64(units))
		l.m.Wait.WithLabelValues(q.label()).Observe(0)
		return Granted
	}
	q.byJob[job] = q.order.PushBack(&waiter{job: job, epoch: epoch, units: units, since: time.Now(), notify: notify})
	q.units += units
	l.setWaiting(q)
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return Pending
}

// Park keeps job's ask under epoch in bucket's queue while the job has no
// actor (it parks, its lock held through the node lease): the place is
// kept, the ask's epoch becomes 0, and wake replaces its notify — told the
// grant or never, not "not yet". A later Take by the job's next actor
// replaces both again; Leave under epoch 0 drops it. It reports whether the
// ask was still queued (false: its answer is on its way to the actor).
func (l *Limiter) Park(job, bucket string, epoch uint64, wake Notify) bool {
	q := l.queue(bucket)
	if q == nil {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.byJob[job]
	if e == nil || e.Value.(*waiter).epoch != epoch {
		return false
	}
	w := e.Value.(*waiter)
	w.epoch, w.told = 0, true
	w.notify = func(granted bool, problem string) {
		if granted || problem != "" {
			wake(granted, problem)
		}
	}
	return true
}

// Leave takes job's ask under epoch out of bucket's queue (a cancel, a
// deadline, the actor stopping), and gives back ret units granted to a
// job that no longer wants them: the next waiters get them.
func (l *Limiter) Leave(job, bucket string, epoch uint64, ret int) {
	q := l.queue(bucket)
	if q == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if e := q.byJob[job]; e != nil && e.Value.(*waiter).epoch == epoch {
		q.remove(e)
		l.setWaiting(q)
	}
	if ret > 0 {
		q.credit = min(q.credit+ret, q.b.Burst)
		l.handOut(q)
	}
}

// setWaiting sets q's waiting gauge (a declared bucket's only: q.mu held).
func (l *Limiter) setWaiting(q *queue) {
	if q.of == "" {
		l.m.Waiting.WithLabelValues(q.b.Name).Set(float64(q.order.Len()))
	}
}

func (q *queue) remove(e *list.Element) {
	w := e.Value.(*waiter)
	q.order.Remove(e)
	delete(q.byJob, w.job)
	q.units -= w.units
}

// handOut grants the node's credit to its waiters in queue order, as far
// as it goes (q.mu held).
func (l *Limiter) handOut(q *queue) {
	now := time.Now()
	for e := q.order.Front(); e != nil; e = q.order.Front() {
		w := e.Value.(*waiter)
		if w.units > q.credit {
			break
		}
		q.credit -= w.units
		q.remove(e)
		l.m.Granted.WithLabelValues(q.label()).Add(float64(w.units))
		l.m.Wait.WithLabelValues(q.label()).Observe(now.Sub(w.since).Seconds())
		w.notify(true, "")
	}
	l.setWaiting(q)
}

// tellQueued tells every waiter not yet told that it waits (q.mu held).
func (q *queue) tellQueued() {
	for e := q.order.Front(); e != nil; e = e.Next() {
		if w := e.Value.(*waiter); !w.told {
			w.told = true
			w.notify(false, "")
		}
	}
}

// run is bucket q's goroutine: idle while nobody waits, otherwise one
// script call per refill.
func (l *Limiter) run(ctx context.Context, q *queue) {
	errs := 0
	var idle <-chan time.Time
	for {
		if q.of != "" {
			idle = time.After(l.idle)
		}
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
		case <-idle:
			if l.dropIdle(q) {
				return
			}
			continue
		}
		for {
			q.mu.Lock()
			jobs := q.order.Len()
			if jobs == 0 {
				q.mu.Unlock()
				break
			}
			first := q.order.Front().Value.(*waiter).units - q.credit
			want := min(q.units-q.credit, q.b.Burst)
			units, b := q.units, q.b
			q.mu.Unlock()

			cctx, cancel := context.WithTimeout(ctx, CallTimeout)
			t, err := l.store.Take(cctx, b, want, first, l.node, jobs, units)
			cancel()
			if ctx.Err() != nil {
				return
			}
			pause := l.minInterval
			q.mu.Lock()
			if err != nil {
				errs++
				l.m.Calls.WithLabelValues(q.label(), "error").Inc()
				if errs == 1 || errs%100 == 0 {
					l.log.Warn("rate limit bucket unreachable; its jobs wait", "bucket", q.b.Name, "err", err, "failures", errs)
				}
				pause = min(l.minInterval<<min(errs, 10), ErrorBackoffMax)
			} else {
				errs = 0
				l.m.Calls.WithLabelValues(q.label(), "ok").Inc()
				if t.Fresh && !q.lastCall.IsZero() && time.Since(q.lastCall) < stateLostWithin {
					l.m.StateLost.WithLabelValues(q.label()).Inc()
					l.log.Warn("rate limit bucket's state lost in Redis (data lost?): it starts full again",
						"bucket", q.b.Name, "reason", "state_lost")
				}
				q.lastCall = time.Now()
				q.level = t.Level
				if q.of == "" {
					l.m.Level.WithLabelValues(q.b.Name).Set(t.Level)
				}
				q.credit += t.Granted
				l.handOut(q)
				pause = min(max(t.Wait, l.minInterval), MaxInterval)
			}
			q.tellQueued()
			q.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
		}
	}
}

// dropIdle drops a template's key bucket q that has had no waiter and no
// ask for the limiter's idle time (its credit, tokens taken and not handed
// out, goes with it: fewer calls, never more). It reports whether it did.
func (l *Limiter) dropIdle(q *queue) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.gone {
		return true
	}
	if q.order.Len() > 0 || time.Since(q.used) < l.idle || l.queues[q.b.Name] != q {
		return false
	}
	q.gone = true
	q.stop()
	delete(l.queues, q.b.Name)
	l.live[q.of]--
	l.m.Dropped.WithLabelValues(q.of).Inc()
	return true
}

// Keys is how many key buckets template has live on this node.
func (l *Limiter) Keys(template string) int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.live[template]
}

// BucketView is one bucket as this node sees it, for troupe ctl limits.
type BucketView struct {
	Level
	// Credit: tokens this node holds for its next waiter.
	Credit int `json:"credit"`
	// Waiters are this node's waiting jobs in queue order (at most
	// the limit asked for); Queued is how many there are.
	Queued  int          `json:"queued"`
	Waiters []JobWaiting `json:"waiters,omitempty"`
}

// JobWaiting is one of this node's jobs waiting for a bucket.
type JobWaiting struct {
	JobID    string    `json:"job_id"`
	Position int       `json:"position"`
	Units    int       `json:"units"`
	Since    time.Time `json:"since"`
}

// View returns each bucket (name "": all) with Redis's level, every node's
// recorded waiters, and this node's waiting jobs (at most limit a bucket).
func (l *Limiter) View(ctx context.Context, name string, limit int) ([]BucketView, error) {
	var out []BucketView
	l.mu.RLock()
	names := make([]string, 0, len(l.queues))
	for n := range l.queues {
		names = append(names, n)
	}
	l.mu.RUnlock()
	slices.Sort(names)
	for _, n := range names {
		if name != "" && n != name {
			continue
		}
		l.mu.RLock()
		q := l.queues[n]
		l.mu.RUnlock()
		if q == nil {
			continue // removed since
		}
		q.mu.Lock()
		b := q.b
		q.mu.Unlock()
		lv, err := l.store.Read(ctx, b)
		if err != nil {
			return nil, err
		}
		v := BucketView{Level: lv}
		q.mu.Lock()
		v.Credit, v.Queued = q.credit, q.order.Len()
		pos := 0
		for e := q.order.Front(); e != nil && pos < limit; e = e.Next() {
			w := e.Value.(*waiter)
			pos++
			v.Waiters = append(v.Waiters, JobWaiting{JobID: w.job, Position: pos, Units: w.units, Since: w.since})
		}
		q.mu.Unlock()
		out = append(out, v)
	}
	return out, nil
}

// Position is job's place in bucket's queue on this node (1: next; 0: not
// waiting here).
func (l *Limiter) Position(job, bucket string) int {
	q := l.queue(bucket)
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.byJob[job] == nil {
		return 0
	}
	pos := 0
	for e := q.order.Front(); e != nil; e = e.Next() {
		pos++
		if e.Value.(*waiter).job == job {
			return pos
		}
	}
	return 0
}
