package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/proto/capv1"
)

// Job is one submit the ticker makes.
type Job struct {
	Req   *capv1.JobRequest
	Trace string
	// MsgID is the JetStream Nats-Msg-Id: a second publish of the same
	// one within the stream's duplicate window is dropped by JetStream.
	MsgID string
	// Due is when the job was due (a tick, or a delayed job's time).
	Due time.Time
}

// LabelDelayedUntil (in meta.labels) replaces a delayed job's run_at /
// run_after label when it is submitted: the job's record shows when it was
// due, and the intake does not hold it again.
const LabelDelayedUntil = "troupe.delayed_until"

// Defaults for Config fields left zero.
const (
	PollDefault  = time.Second
	LeaseDefault = 15 * time.Second
	BatchDefault = 1000
	// LookaheadDefault keeps the take's Redis round trip (tens of ms for
	// 1,000 jobs on a loaded host) off the due time.
	LookaheadDefault = 250 * time.Millisecond
	// maxEnumerate bounds the ticks walked in one firing of a schedule.
	maxEnumerate = 100_000
	// maxOnTime bounds the on-time ticks fired at once (a grace much
	// longer than the interval).
	maxOnTime = 1000
)

// Config configures a Ticker.
type Config struct {
	Store *Store
	// Submit publishes jobs on the submit subject, all of them or an
	// error (required).
	Submit func(ctx context.Context, jobs []Job) error
	Log    *slog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// Poll is the longest the ticker sleeps between looks at Redis (it
	// also wakes at the earliest due time it knows, and when this node
	// holds a new delayed job); default PollDefault.
	Poll time.Duration
	// Lease is how long a tick's claim, or a taken delayed job, stays
	// with a replica that does not finish it; default LeaseDefault.
	Lease time.Duration
	// Batch is how many due delayed jobs one Redis call takes; default
	// BatchDefault.
	Batch int
	// Lookahead: delayed jobs due within it are taken early and submitted
	// at their time (default LookaheadDefault).
	Lookahead time.Duration
	// Metrics, when set, receives the ticker's metrics.
	Metrics prometheus.Registerer
	// Held, when set, is told of each delayed job once this node stored
	// it (the node indexes it, to end it visibly if Redis loses it).
	Held func(jobID string, due time.Time)
}

// Ticker fires schedules' ticks and due delayed jobs. It is a node
// component: Start(ctx) / Stop(ctx). Every replica runs one; Redis makes
// each tick and each delayed job fire once.
type Ticker struct {
	cfg  Config
	wake chan struct{}

	mu       sync.Mutex
	cancel   context.CancelFunc
	done     chan struct{}
	adds     chan pendingAdd // held submits for addLoop (nil: not running); sent to under mu
	addsDone chan struct{}
	fired    *prometheus.CounterVec
	lag      prometheus.Histogram
	missed   prometheus.Counter
	caughtUp prometheus.Counter
	waiting  prometheus.Gauge
	errors   prometheus.Counter
	restored prometheus.Counter

	// The node's copy of every schedule's definition, read again when
	// their change count moves (at most every knownEvery), to write back
	// what a Redis data loss takes (Restore).
	knownMu   sync.Mutex
	known     map[string]string // id → definition JSON
	knownVer  int64
	knownRead bool
	knownAt   time.Time
	knownLen  prometheus.GaugeFunc
}

// knownEvery is how often a ticker looks at the schedules' change count.
const knownEvery = time.Second

// NewTicker returns a ticker that is not running.
func NewTicker(cfg Config) *Ticker {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Poll <= 0 {
		cfg.Poll = PollDefault
	}
	if cfg.Lease <= 0 {
		cfg.Lease = LeaseDefault
	}
	if cfg.Batch <= 0 {
		cfg.Batch = BatchDefault
	}
	if cfg.Lookahead <= 0 {
		cfg.Lookahead = LookaheadDefault
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	t := &Ticker{cfg: cfg, wake: make(chan struct{}, 1),
		fired: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_schedule_jobs_submitted_total",
			Help: "Jobs this node submitted for schedule ticks (kind=tick) and due delayed jobs (kind=delayed)."}, []string{"kind"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "troupe_schedule_submit_lag_seconds",
			Help:    "How late after its due time this node submitted a tick's or delayed job's job.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30, 60}}),
		missed: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_schedule_ticks_missed_total",
			Help: "Schedule ticks found missed (older than their grace) and dropped by the missed-tick policy."}),
		caughtUp: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_schedule_ticks_caught_up_total",
			Help: "Missed schedule ticks fired late by the catch_up policy (counted in jobs_submitted_total too)."}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "troupe_schedule_delayed_waiting",
			Help: "Delayed jobs held (all replicas') not yet submitted, as of this node's last look."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_schedule_errors_total",
			Help: "Ticker passes that failed (Redis or the submit stream); what was due stays due."}),
		restored: prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_schedules_restored_total",
			Help: "Schedule definitions this node wrote back from its copy after Redis lost its data."}),
	}
	t.knownLen = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "troupe_schedules_known",
		Help: "Schedule definitions this node keeps a copy of, to write back if Redis loses them."},
		func() float64 { t.knownMu.Lock(); defer t.knownMu.Unlock(); return float64(len(t.known)) })
	if cfg.Metrics != nil {
		for _, c := range []prometheus.Collector{t.fired, t.lag, t.missed, t.caughtUp, t.waiting, t.errors, t.restored, t.knownLen} {
			_ = cfg.Metrics.Register(c)
		}
	}
	return t
}

// Store returns the ticker's store.
func (t *Ticker) Store() *Store { return t.cfg.Store }

// Start starts the ticker's loop; it runs until Stop (ctx only bounds the
// start, which does nothing that blocks).
func (t *Ticker) Start(context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cancel != nil {
		return errors.New("schedule: ticker already started")
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel, t.done = cancel, make(chan struct{})
	t.adds, t.addsDone = make(chan pendingAdd, 4*t.cfg.Batch), make(chan struct{})
	go t.loop(ctx, t.done)
	go t.addLoop(t.adds, t.addsDone)
	return nil
}

// Stop ends the loop and waits for a pass in progress, at most until ctx
// ends. What a pass left unfinished (a claimed tick, taken delayed jobs)
// is fired by another replica when its lease ends.
func (t *Ticker) Stop(ctx context.Context) error {
	t.mu.Lock()
	cancel, done, adds, addsDone := t.cancel, t.done, t.adds, t.addsDone
	t.adds = nil // Hold writes at once from now on
	t.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	if adds != nil {
		close(adds)
	}
	for _, ch := range []chan struct{}{done, addsDone} {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Wake makes the loop look again now (a delayed job was added).
func (t *Ticker) Wake() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// loop runs the two halves on their own goroutines, so that waiting for
// a delayed group's time never holds a schedule's tick back (and the
// reverse).
func (t *Ticker) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		t.every(ctx, nil, func(ctx context.Context) (time.Time, bool, error) {
			t.refreshKnown(ctx)
			if err := t.fireDue(ctx); err != nil {
				return time.Time{}, false, err
			}
			return t.cfg.Store.earliestTick(ctx)
		})
	}()
	go func() {
		defer wg.Done()
		t.every(ctx, t.wake, func(ctx context.Context) (time.Time, bool, error) {
			if err := t.drainDelayed(ctx); err != nil {
				return time.Time{}, false, err
			}
			at, n, err := t.cfg.Store.earliestDelayed(ctx, t.cfg.Lookahead)
			if err == nil {
				t.waiting.Set(float64(n))
			}
			return at, n > 0, err
		})
	}()
	wg.Wait()
}

// every runs pass until ctx ends: again at the time it returns (at most
// Poll later), or when wake fires.
func (t *Ticker) every(ctx context.Context, wake <-chan struct{}, pass func(context.Context) (time.Time, bool, error)) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-wake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
		wait := t.cfg.Poll
		next, found, err := pass(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			t.errors.Inc()
			t.cfg.Log.Warn("schedule: ticker pass failed; what was due stays due", "err", err)
		} else if found {
			if d := next.Sub(t.cfg.Now()); d < wait {
				wait = max(d, 0)
			}
		}
		timer.Reset(wait)
	}
}

// RunOnce fires everything due now: due delayed jobs first (in batches of
// Batch), then due schedules' ticks. It returns the earliest due time left
// (found false when nothing is scheduled).
func (t *Ticker) RunOnce(ctx context.Context) (next time.Time, found bool, err error) {
	// A failure of one part does not hold the other back.
	if err := errors.Join(t.drainDelayed(ctx), t.fireDue(ctx)); err != nil {
		return time.Time{}, false, err
	}
	a, okA, err := t.cfg.Store.earliestTick(ctx)
	if err != nil {
		return time.Time{}, false, err
	}
	b, n, err := t.cfg.Store.earliestDelayed(ctx, t.cfg.Lookahead)
	if err != nil {
		return time.Time{}, false, err
	}
	t.waiting.Set(float64(n))
	okB := n > 0
	switch {
	case okA && (!okB || a.Before(b)):
		return a, true, nil
	case okB:
		return b, true, nil
	}
	return time.Time{}, false, nil
}

// refreshKnown reads the schedules' definitions again when their change
// count moved since the copy was made (one GET otherwise, at most every
// knownEvery). A count of 0 after the first read means Redis lost it (or
// nodes of the version before made every change): the copy is kept, for
// Restore.
func (t *Ticker) refreshKnown(ctx context.Context) {
	t.knownMu.Lock()
	now := t.cfg.Now()
	if now.Sub(t.knownAt) < knownEvery {
		t.knownMu.Unlock()
		return
	}
	t.knownAt = now
	read, ver := t.knownRead, t.knownVer
	t.knownMu.Unlock()
	st := t.cfg.Store
	if read {
		v, err := st.defsVersion(ctx)
		if err != nil || v == ver || v == 0 {
			return
		}
	}
	defs, v, err := st.allDefs(ctx)
	if err != nil || read && v == 0 {
		return
	}
	t.knownMu.Lock()
	t.known, t.knownVer, t.knownRead = defs, v, true
	t.knownMu.Unlock()
}

// Restore writes back, after Redis lost its data, the schedules of the
// node's copy that Redis no longer holds, each due at its first tick after
// since (when Redis was last seen intact): ticks missed since are its
// missed-tick policy's to fire or drop, and one fired again within the
// submit stream's duplicate window is dropped there (its Nats-Msg-Id).
// Every replica restores from its own copy; a definition another wrote
// back first is left alone. It returns the ids it wrote back.
func (t *Ticker) Restore(ctx context.Context, since time.Time) ([]string, error) {
	t.knownMu.Lock()
	defs := t.known
	t.knownMu.Unlock()
	ids, err := t.cfg.Store.restore(ctx, defs, since)
	t.restored.Add(float64(len(ids)))
	return ids, err
}

// fireDue fires the schedules due now (up to 1,000 a pass).
func (t *Ticker) fireDue(ctx context.Context) error {
	now := t.cfg.Now()
	due, err := t.cfg.Store.dueSchedules(ctx, now, 1000)
	if err != nil {
		return err
	}
	var firstErr error
	for _, z := range due {
		id, _ := z.Member.(string)
		if err := t.fireSchedule(ctx, id, int64(z.Score), now); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("schedule %s: %w", id, err)
		}
	}
	return firstErr
}

// drainDelayed submits the delayed jobs due now, and takes those due
// within Lookahead too, waits for their time and submits them then (the
// take's round trip is then off the due time's critical path): Batch per
// Redis call, at most 100 calls per pass.
func (t *Ticker) drainDelayed(ctx context.Context) error {
	for range 100 {
		now := t.cfg.Now()
		taken, err := t.cfg.Store.takeDelayed(ctx, now.Add(t.cfg.Lookahead), now.Add(t.cfg.Lease), t.cfg.Batch)
		if err != nil || len(taken) == 0 {
			return err
		}
		jobs := make([]Job, 0, len(taken))
		var bad []string
		for _, d := range taken {
			req := &capv1.JobRequest{}
			if err := proto.Unmarshal(d.Request, req); err != nil {
				t.cfg.Log.Error("schedule: delayed job unreadable; dropped", "job_id", d.JobID, "err", err)
				bad = append(bad, d.JobID)
				continue
			}
			delete(req.Labels, LabelRunAt)
			delete(req.Labels, LabelRunAfter)
			if req.Meta == nil {
				req.Meta = &capv1.JobMetadata{}
			}
			if req.Meta.Labels == nil {
				req.Meta.Labels = map[string]string{}
			}
			delete(req.Meta.Labels, LabelRunAt)
			delete(req.Meta.Labels, LabelRunAfter)
			req.Meta.Labels[LabelDelayedUntil] = d.Due.UTC().Format(time.RFC3339Nano)
			jobs = append(jobs, Job{Req: req, Trace: d.TraceID, MsgID: "delayed:" + d.JobID, Due: d.Due})
		}
		if err := t.cfg.Store.doneDelayed(ctx, bad); err != nil {
			return err
		}
		// Due order (the take returns score order, but a job may have been
		// re-scored by a lease); each group at its time.
		slices.SortStableFunc(jobs, func(a, b Job) int { return a.Due.Compare(b.Due) })
		for i := 0; i < len(jobs); {
			at := jobs[i].Due
			if d := at.Sub(t.cfg.Now()); d > 0 {
				timer := time.NewTimer(d)
				select {
				case <-timer.C:
				case <-ctx.Done():
					timer.Stop()
					return ctx.Err() // taken jobs are due again when their lease ends
				}
			}
			j := i
			for j < len(jobs) && !jobs[j].Due.After(at) {
				j++
			}
			// And whatever else is due by now.
			for now := t.cfg.Now(); j < len(jobs) && !jobs[j].Due.After(now); j++ {
			}
			if err := t.submit(ctx, "delayed", jobs[i:j]); err != nil {
				return err // taken jobs are due again when their lease ends
			}
			ids := make([]string, 0, j-i)
			for _, jb := range jobs[i:j] {
				ids = append(ids, jb.Req.JobId)
			}
			if err := t.cfg.Store.doneDelayed(ctx, ids); err != nil {
				return err
			}
			i = j
		}
		if len(taken) < t.cfg.Batch {
			return nil
		}
	}
	return nil
}

func (t *Ticker) submit(ctx context.Context, kind string, jobs []Job) error {
	if len(jobs) == 0 {
		return nil
	}
	if err := t.cfg.Submit(ctx, jobs); err != nil {
		return err
	}
	now := t.cfg.Now()
	t.fired.WithLabelValues(kind).Add(float64(len(jobs)))
	for _, j := range jobs {
		t.lag.Observe(max(now.Sub(j.Due), 0).Seconds())
	}
	return nil
}

// Plan is what one firing of a schedule submits: the catch-up ticks (the
// most recent missed ones the policy keeps) and the on-time ticks, oldest
// first, how many missed ticks it drops, and the next tick after now.
type Plan struct {
	Fire     []time.Time
	Dropped  int
	CaughtUp int // of Fire, the missed ticks the policy keeps
	Next     time.Time
}

// PlanTicks returns what s fires at now when its stored next tick is tick:
// ticks at or before now within s's grace fire; older ones are missed, and
// the policy fires the most recent CatchUp of them (skip: none).
func PlanTicks(s *Schedule, spec Spec, tick, now time.Time) Plan {
	var p Plan
	grace := s.GraceOr()
	late := now.Add(-grace)
	T := tick
	if T.Before(late) {
		keep := s.CatchUp
		var ring []time.Time
		n := 0
		for ; !T.IsZero() && T.Before(late) && n < maxEnumerate; n++ {
			if keep > 0 {
				if len(ring) == keep {
					ring = ring[1:]
				}
				ring = append(ring, T)
			}
			T = spec.Next(T)
		}
		if n == maxEnumerate { // an outage too long to walk: jump to the grace
			T = spec.Next(late.Add(-time.Millisecond))
		}
		p.Fire = append(p.Fire, ring...)
		p.Dropped, p.CaughtUp = n-len(ring), len(ring)
	}
	for !T.IsZero() && !T.After(now) {
		if len(p.Fire) < keepOnTime(s) {
			p.Fire = append(p.Fire, T)
		} else {
			p.Dropped++
		}
		T = spec.Next(T)
	}
	p.Next = T
	return p
}

func keepOnTime(s *Schedule) int { return maxOnTime + s.CatchUp }

// fireSchedule fires schedule id's due tick (and what the missed-tick
// policy adds) if this replica claims it.
func (t *Ticker) fireSchedule(ctx context.Context, id string, tickMS int64, now time.Time) error {
	st := t.cfg.Store
	s, err := st.Get(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return st.rdb.ZRem(ctx, st.due, id).Err()
	}
	if err != nil {
		return err
	}
	if s.Paused {
		return st.rdb.ZRem(ctx, st.due, id).Err()
	}
	spec, err := s.Spec()
	if err != nil {
		return err
	}
	ok, err := st.claimTick(ctx, id, tickMS, t.cfg.Lease)
	if err != nil || !ok {
		return err
	}
	plan := PlanTicks(s, spec, time.UnixMilli(tickMS), now)
	jobs := make([]Job, 0, len(plan.Fire))
	for _, at := range plan.Fire {
		req := s.Request(at)
		jobs = append(jobs, Job{Req: req, Trace: traceFor(req.JobId), MsgID: "sched:" + req.JobId, Due: at})
	}
	if err := t.submit(ctx, "tick", jobs); err != nil {
		return err // the claim's lease ends; the tick fires then
	}
	t.caughtUp.Add(float64(plan.CaughtUp))
	if plan.Dropped > 0 || plan.CaughtUp > 0 {
		t.missed.Add(float64(plan.Dropped))
		t.cfg.Log.Warn("schedule: missed ticks", "schedule", id, "dropped", plan.Dropped,
			"policy", s.Missed, "caught_up", plan.CaughtUp)
	}
	var fired *Fired
	if n := len(jobs); n > 0 {
		fired = &Fired{Tick: plan.Fire[n-1].UTC(), JobID: jobs[n-1].Req.JobId, FiredAt: t.cfg.Now().UTC()}
	}
	nextMS := int64(-1)
	if !plan.Next.IsZero() {
		nextMS = plan.Next.UnixMilli()
	}
	if nextMS < 0 {
		return st.rdb.ZRem(ctx, st.due, id).Err()
	}
	return st.advance(ctx, id, tickMS, nextMS, fired)
}

// Divert holds req if its labels ask to run later (LabelRunAt,
// LabelRunAfter), writing it to Redis before it returns: held reports it
// did; bad names a malformed label; err a Redis error. stored is when the
// submit entered the stream. (The node's intake uses Hold, which writes in
// batches.)
func (t *Ticker) Divert(req *capv1.JobRequest, trace string, stored time.Time) (held bool, bad string, err error) {
	due, later, bad := t.dueOf(req, stored)
	if !later {
		return false, bad, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := delayedOf(req, trace, due, stored)
	if err := t.cfg.Store.AddDelayed(ctx, []Delayed{d}); err != nil {
		return false, "", err
	}
	t.held(d)
	t.Wake()
	return true, "", nil
}

// Hold is the intake's hook (intake.DelayHook): Divert, with the write
// batched with the other submits held meanwhile (one Redis round trip per
// batch); settle is called once the job is stored or could not be.
func (t *Ticker) Hold(req *capv1.JobRequest, trace string, stored time.Time, settle func(error)) (held bool, bad string) {
	due, later, bad := t.dueOf(req, stored)
	if !later {
		return false, bad
	}
	t.mu.Lock()
	if t.adds != nil {
		// Under mu: Stop closes adds only after taking it from here.
		t.adds <- pendingAdd{d: delayedOf(req, trace, due, stored), settle: settle}
		t.mu.Unlock()
		return true, ""
	}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d := delayedOf(req, trace, due, stored)
	err := t.cfg.Store.AddDelayed(ctx, []Delayed{d})
	if err == nil {
		t.held(d)
	}
	settle(err)
	t.Wake()
	return true, ""
}

// held tells Config.Held of d, stored.
func (t *Ticker) held(d Delayed) {
	if t.cfg.Held != nil {
		t.cfg.Held(d.JobID, d.Due)
	}
}

func (t *Ticker) dueOf(req *capv1.JobRequest, stored time.Time) (time.Time, bool, string) {
	if len(req.GetLabels()) == 0 && len(req.GetMeta().GetLabels()) == 0 {
		return time.Time{}, false, ""
	}
	if stored.IsZero() {
		stored = t.cfg.Now()
	}
	due, later, err := DueAt(req, stored)
	if err != nil {
		return time.Time{}, false, err.Error()
	}
	return due, later, ""
}

// pendingAdd is a held submit waiting for its batch's write.
type pendingAdd struct {
	d      Delayed
	settle func(error)
}

// addLoop writes held submits in batches: whatever has queued while the
// previous batch was written, up to Batch. It ends when adds is closed,
// after writing what is left.
func (t *Ticker) addLoop(adds chan pendingAdd, done chan struct{}) {
	defer close(done)
	batch := make([]pendingAdd, 0, t.cfg.Batch)
	for first := range adds {
		batch = append(batch[:0], first)
	more:
		for len(batch) < t.cfg.Batch {
			select {
			case p, ok := <-adds:
				if !ok {
					break more
				}
				batch = append(batch, p)
			default:
				break more
			}
		}
		ds := make([]Delayed, len(batch))
		for i, p := range batch {
			ds[i] = p.d
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := t.cfg.Store.AddDelayed(ctx, ds)
		cancel()
		for _, p := range batch {
			if err == nil {
				t.held(p.d)
			}
			p.settle(err)
		}
		t.Wake()
	}
}
