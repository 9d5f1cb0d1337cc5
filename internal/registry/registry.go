// Package registry keeps the live view of workers built from CAP heartbeats.
// A Registry is owned by one goroutine (the router actor) and is not safe for
// concurrent use.
//
// Besides the id → worker map, the registry keeps one placement index per
// pool: a binary min-heap of the workers that may take work now, ordered by
// load score with a random secondary key (see Worker.Before). The router
// reads the heap's top instead of scanning the pool, so a pick costs
// O(log n). Label selectors (selector.go) add the same kind of index per
// label set that jobs ask for.
//
// A worker is in exactly one of three places inside each index it is in:
//   - the heap (eligible: not overloaded, not known to be stale),
//   - the overloaded set (counted only; it re-enters the heap when a
//     heartbeat or a threshold change says it has room),
//   - the stale set (counted only; the router found it past its deadline at
//     pick time and pulled it out; a heartbeat brings it back, the sweep
//     evicts it).
package registry

import (
	"hash/maphash"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// TTLDefault is how long a worker stays live without a heartbeat. CAP SDK
// workers beat every 5 s, so 30 s tolerates five lost beats.
const TTLDefault = 30 * time.Second

// MissedIntervals is how many heartbeat intervals a worker whose interval is
// known may miss before it is stale. Its deadline is last beat +
// (MissedIntervals + ½) intervals: the half interval absorbs network and
// mailbox jitter, so a worker is stale once its third beat is clearly late,
// not the instant it is due.
const MissedIntervals = 3

// LearnedTTLFloor bounds an interval-derived TTL from below. A heartbeat
// crosses NATS, intake and the router's mailbox; under load and GC that can
// take a good part of a second, and a TTL shorter than this would make a
// healthy fast-beating worker flap between live and stale.
const LearnedTTLFloor = 2 * time.Second

// gapWindow is how many recent heartbeat gaps are kept to learn a worker's
// interval. The interval is the largest of them, so one extra out-of-band
// beat cannot shrink the TTL; a real change of interval is picked up after
// gapWindow beats.
const gapWindow = 4

// minGapsToLearn: one gap may be a beat sent early on a state change;
// two consecutive gaps are needed before the registry trusts an interval.
const minGapsToLearn = 2

// Heartbeat labels with a meaning to the registry.
const (
	// LabelDispatch is the heartbeat label by which a worker says how it
	// wants jobs delivered. LabelDispatch=DispatchDirect means the worker
	// subscribes to worker.<id>.jobs and the router may send it jobs there;
	// any other value, or none (stock CAP SDK workers), means the worker only
	// listens on its pool subject (the job's topic), so Troupe publishes there.
	LabelDispatch  = "troupe.dispatch"
	DispatchDirect = "direct"

	// LabelDedupe=DedupeJobID says the worker runs a job id at most once
	// however often it is delivered, and answers a repeated delivery of a
	// job it holds with a RUNNING JobProgress. The node may then repeat a
	// direct dispatch that shows no sign of having arrived (a core NATS
	// publish is lost when the server restarts or the worker reconnects);
	// to other workers a job is dispatched once.
	LabelDedupe = "troupe.dedupe"
	DedupeJobID = "job_id"

	// LabelHeartbeatInterval lets a worker announce its heartbeat interval
	// (a Go duration such as "5s"). CAP's Heartbeat has no field for it. An
	// announced interval wins over a learned one.
	LabelHeartbeatInterval = "troupe.heartbeat_interval"

	// LabelProgress=ProgressStarted says the worker sends a RUNNING
	// JobProgress when it starts a job. A job at any other worker (stock
	// CAP SDK workers send no progress) counts as started on delivery: its
	// time bound is the run's (the running timeout), not the dispatch
	// timeout, which would otherwise cut every long job short.
	LabelProgress   = "troupe.progress"
	ProgressStarted = "started"
)

// Env keys a node adds to a direct dispatch (JobRequest.env), so a worker
// can tell a dispatch that reached it after a silence the node could have
// evicted it for (and re-placed the job), and drop it instead of running
// the job a second time. Both are in the worker's terms: EnvHeardBeat is
// the send time (the heartbeat packet's created_at, Unix nanoseconds) of
// the worker's latest heartbeat the node had heard when it sent the
// dispatch, EnvEvictAfter the liveness window (milliseconds) the node
// applied to the worker: a silence that long and the node evicts it.
const (
	EnvHeardBeat  = "troupe.heard_beat"
	EnvEvictAfter = "troupe.evict_after_ms"
)

// Overload thresholds applied when a pool sets none (CAP's reference values).
const (
	// ActiveRatioDefault: a worker takes jobs until its in-flight count
	// reaches max_parallel_jobs. The count is exact for what Troupe sent it
	// (see Worker.InFlight), so no head room is kept for a stale figure.
	ActiveRatioDefault = 1.0 // in flight / max_parallel
	CPULoadMaxDefault  = 90  // percent
	GPUUtilMaxDefault  = 90  // percent
)

// Thresholds say when a pool's worker is overloaded: at or above any of
// them. A zero field takes its default.
type Thresholds struct {
	// ActiveRatio bounds InFlight/max_parallel_jobs, checked
	// only for workers that report max_parallel_jobs > 0. In (0, 1].
	ActiveRatio float64
	// CPULoad and GPUUtil bound the reported percentages. In (0, 100].
	CPULoad float32
	GPUUtil float32
}

// WithDefaults fills zero fields with the defaults.
func (t Thresholds) WithDefaults() Thresholds {
	if t.ActiveRatio <= 0 {
		t.ActiveRatio = ActiveRatioDefault
	}
	if t.CPULoad <= 0 {
		t.CPULoad = CPULoadMaxDefault
	}
	if t.GPUUtil <= 0 {
		t.GPUUtil = GPUUtilMaxDefault
	}
	return t
}

type placement uint8

const (
	placedNone placement = iota
	placedHeap
	placedOverloaded
	placedStale
	// placedAway: another replica places jobs on the worker (see SetAway),
	// or this one has used up its share of its slots (SetShare);
	// neither in the heap nor counted.
	placedAway
)

// Worker is one worker as the registry sees it. Exported fields are read-only
// outside the registry (the router's DirectSubject cache excepted).
type Worker struct {
	// The fields a pick reads and writes come first, together, so a pick
	// touches two cache lines of the chosen worker rather than five; at 10k
	// workers the registry no longer fits in L2 and those misses are most
	// of a pick's cost.

	deadline time.Time // live while now is before it
	// score and tie are the sort key (see Before); tie is redrawn on every
	// score change.
	score       float64
	tie         uint32
	placed      placement // the same in every index the worker is in
	Direct      bool
	Dedupe      bool  // LabelDedupe: repeated deliveries are safe
	Reports     bool  // LabelProgress: the worker says when it starts a job
	ActiveJobs  int32 // as last reported by the worker
	MaxParallel int32
	// Dispatched counts this node's jobs on the worker: placed and not yet
	// answered (a result, the job's end, or its return to be placed again).
	// See InFlight for what placement counts.
	Dispatched int32
	// Others is what the other replicas say they have in flight on the
	// worker (SetOthers), Foreign the jobs the last heartbeat showed beyond
	// every replica's count (another scheduler, or jobs adopted after a
	// replica died).
	Others  int32
	Foreign int32
	CPULoad float32
	GPUUtil float32
	// oldOwn counts this node's jobs placed a whole heartbeat interval or
	// more before the worker's last heartbeat, which therefore should have
	// counted them in active_jobs; oldCap is that heartbeat's active_jobs.
	// When oldOwn > oldCap, the worker no longer holds some of them (it
	// restarted, or their results were lost) and their slots are free.
	//
	// A shared worker (one on the pool subject, poolcount.go) is
	// reconciled with its pool instead: its jobs are old by the pool's
	// rounds, and gone of them (assigned by the pool) stop counting.
	oldOwn   int32
	oldCap   int32
	gone     int32
	reported bool // the worker has reported active_jobs > 0 at least once
	away     bool // another replica owns placement on it (SetAway)
	// shareRank and shareOf: this replica's rank among shareOf replicas
	// that split the worker's slots (SetShare; shareOf ≤ 1: no split).
	shareRank int32
	shareOf   int32
	shared    bool // reconciled with its pool (poolcount.go)
	// lag is the least delay (this node's clock less the sender's) its
	// heartbeats have shown, rising slowly so a drifting clock is
	// followed; beatAt is when the last beat was sent, in this node's
	// clock by lag (when it was seen, without a sent time).
	lag       time.Duration
	lagKnown  bool
	beatAt    time.Time
	beats     uint32
	roundSeen uint32        // the pool round of its last beat
	young     [stamps]int32 // own jobs by stamp%stamps at placement, not yet old
	jobs      map[string]uint32
	linger    map[string]time.Time // jobs ended without the worker's answer (Linger)
	// main is the worker's entry in its pool's index, sel its entries in
	// the pool's label selectors.
	main member
	pool *poolIndex
	sel  []member
	// DirectSubject caches the worker's direct subject for the router, which
	// sets it on first use so a pick does not build a string. The registry
	// never reads it.
	DirectSubject string
	ID            string

	Pool         string
	Region       string
	Type         string
	Capabilities []string
	// Labels is the map from the last heartbeat. The registry replaces it on
	// every beat and never mutates it, so a copy of the reference is safe to
	// read from another goroutine.
	Labels   map[string]string
	LastSeen time.Time
	// Interval is the heartbeat interval the worker announced or the
	// registry learned; 0 while unknown.
	Interval time.Duration

	cadence     // its heartbeats' gaps (learnInterval), kept across an eviction (cadence.go)
	poolPos int // index in its pool's members
}

// Load is the worker's score for least-loaded placement: lower is better.
func (w *Worker) Load() float64 {
	return float64(w.InFlight()) + float64(w.CPULoad)/100 + float64(w.GPUUtil)/100
}

// InFlight is the number of jobs the worker holds as placement counts
// them: this node's (Dispatched), less those its heartbeats show it no
// longer holds, plus the other replicas' (Others) and the unexplained rest
// of its last heartbeat (Foreign).
//
// This node's part is exact the moment a job is placed and the moment its
// answer is seen: a slot frees on the result, not at the next heartbeat,
// and jobs sent since the last heartbeat are never forgotten by it.
func (w *Worker) InFlight() int32 {
	own := w.Dispatched
	if w.shared {
		own -= w.gone
	} else if w.reported && w.oldOwn > w.oldCap {
		own -= w.oldOwn - w.oldCap
	}
	return max(own, 0) + w.Others + w.Foreign
}

// jobStarted marks a job, in Worker.jobs, that has reported progress (it
// is no longer waiting for the worker to take it); the rest of the value is
// the worker's heartbeat count when the job was placed.
const jobStarted = 1 << 31

// jobUnsent marks a job, in Worker.jobs, placed on a worker that does not
// report its start and not yet started (see Start): it is in no age
// bucket, so heartbeats never free it.
const jobUnsent = 1 << 30

// Before orders workers for placement: lower score first, and between equal
// scores the lower random key. Keys are redrawn whenever a score changes, so
// among equal workers the first is a fair random draw.
func (w *Worker) Before(o *Worker) bool {
	return w.score < o.score || (w.score == o.score && w.tie < o.tie)
}

// Deadline is when the worker turns stale without another heartbeat.
func (w *Worker) Deadline() time.Time { return w.deadline }

// Overloaded reports whether the worker is overloaded under the default
// thresholds. The router uses Registry.Overloaded, which applies the pool's.
func (w *Worker) Overloaded() bool { return w.overloadedBy(Thresholds{}.WithDefaults()) }

func (w *Worker) overloadedBy(t Thresholds) bool {
	if w.MaxParallel > 0 && float64(w.InFlight())/float64(w.MaxParallel) >= t.ActiveRatio-1e-9 {
		return true
	}
	return w.CPULoad >= t.CPULoad || w.GPUUtil >= t.GPUUtil
}

// HasLabels reports whether the worker's labels include every want pair.
func (w *Worker) HasLabels(want map[string]string) bool {
	for k, v := range want {
		if got, ok := w.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// poolIndex is one pool's members, its placement index and its label
// selectors.
type poolIndex struct {
	index
	poolCounts
	name       string
	th         Thresholds // with defaults applied
	members    []*Worker
	selectors  map[uint64][]*selector // by label-set key; a slice for collisions
	nSelectors int
}

// Registry maps worker ids to workers, with a per-pool index.
type Registry struct {
	ttl        time.Duration
	workers    map[string]*Worker
	trails     trails // the cadence of workers evicted lately (cadence.go)
	pools      map[string]*poolIndex
	thresholds map[string]Thresholds // as configured, defaults not applied
	rnd        *rand.Rand
	seed       maphash.Seed
	lim        limits // bounds.go
}

// New returns an empty registry with liveness ttl (TTLDefault if ≤ 0).
func New(ttl time.Duration) *Registry {
	if ttl <= 0 {
		ttl = TTLDefault
	}
	return &Registry{ttl: ttl, workers: map[string]*Worker{}, pools: map[string]*poolIndex{},
		rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), seed: maphash.MakeSeed(), lim: newLimits(Bounds{})}
}

// TTL returns the configured liveness TTL (the bound for every worker).
func (r *Registry) TTL() time.Duration { return r.ttl }

// Observe records a heartbeat seen at now and returns the worker. It
// refreshes liveness, puts a stale worker back in play and reconciles the
// in-flight count with the worker's active_jobs (see reconcile).
func (r *Registry) Observe(hb *capv1.Heartbeat, now time.Time) *Worker {
	return r.ObserveSent(hb, now, time.Time{})
}

// ObserveSent is Observe with the time the worker sent the heartbeat (its
// packet's created_at; zero when unknown). The interval is then learned
// from the sender's clock: heartbeats that queued while this node was
// paused, and arrive in a burst, still show the worker's real interval
// (learned from arrival times they would show a millisecond, and the
// worker's liveness window would fall below its interval).
//
// A heartbeat beyond the registry's bounds (SetBounds) is refused: it
// returns nil and the registry is unchanged.
func (r *Registry) ObserveSent(hb *capv1.Heartbeat, now, sent time.Time) *Worker {
	if !r.admit(hb.WorkerId, hb.Pool) {
		return nil
	}
	w := r.workers[hb.WorkerId]
	if w == nil {
		w = newWorker(hb.WorkerId)
		r.workers[hb.WorkerId] = w
		r.trails.resume(w, now)
	}
	if w.pool != nil && w.Pool != hb.Pool {
		r.detach(w)
	}
	if w.pool != nil {
		w.pool.unsum(w)
	}
	relabel := w.pool != nil && !labelsEqual(w.Labels, hb.Labels)
	if relabel {
		r.unlinkSelectors(w)
	}
	w.Pool, w.Region, w.Type = hb.Pool, hb.Region, hb.Type
	w.CPULoad, w.GPUUtil = percent(hb.CpuLoad), percent(hb.GpuUtilization)
	w.ActiveJobs, w.MaxParallel = max(hb.ActiveJobs, 0), hb.MaxParallelJobs
	w.Capabilities, w.Labels = hb.Capabilities, hb.Labels
	w.Direct = strings.EqualFold(hb.Labels[LabelDispatch], DispatchDirect)
	w.Dedupe = strings.EqualFold(hb.Labels[LabelDedupe], DedupeJobID)
	w.Reports = strings.EqualFold(hb.Labels[LabelProgress], ProgressStarted)
	if w.ActiveJobs > 0 || w.MaxParallel > 0 {
		w.reported = true
	}
	if w.pool == nil {
		r.attach(w)
	} else {
		if w.shared == w.Direct { // its dispatch changed
			w.shared = !w.Direct
			w.restamp()
		}
		w.pool.sum(w)
		if relabel {
			r.linkSelectors(w)
		}
	}
	w.beatAt = now
	if !sent.IsZero() {
		d := now.Sub(sent)
		if !w.lagKnown || d < w.lag {
			w.lag, w.lagKnown = d, true
		} else {
			w.lag += (d - w.lag) / 1024
		}
		w.beatAt = sent.Add(w.lag)
	}
	r.reconcile(w)
	for job, until := range w.linger {
		if now.After(until) {
			r.Vacate(w, job)
		}
	}
	r.learnInterval(w, now, sent)
	w.LastSeen = now
	w.deadline = now.Add(r.ttlFor(w))
	r.rekey(w)
	r.place(w, r.wanted(w))
	return w
}

func newWorker(id string) *Worker { return &Worker{ID: id} }

// reconcile takes in a heartbeat's active_jobs (already in ActiveJobs,
// and in its pool's sums). A shared worker is reconciled with its pool
// (poolcount.go); the rest of this comment is about the others.
//
// Jobs this node placed before the worker's previous heartbeat have had a
// whole interval to arrive, so the worker should count them: they become
// "old". If the worker reports fewer jobs than this node has old ones, the
// difference is not there (the worker restarted, or results were lost) and
// stops counting until those jobs end. The test is one-sided on purpose:
// min(old, active_jobs) can only over-state what the worker holds of ours,
// never under-state it, so reconciling never over-fills a worker.
//
// Foreign is the rest of active_jobs: what neither this node nor the other
// replicas account for.
//
// A worker that announces max_parallel_jobs reports active_jobs beside it
// (CAP heartbeats carry both, and the stock SDKs fill both), so its 0 is a
// count: it reconciles from its first heartbeat. Otherwise, a worker that
// has never reported active_jobs > 0 may simply not report it; its own
// count is then trusted alone. (Waiting for a first active_jobs > 0 kept
// the slots of jobs that NATS handed to another member of a pool subject,
// then lost, counted on an idle worker until their running deadline.)
func (r *Registry) reconcile(w *Worker) {
	w.beats++
	if b := w.beats; !w.shared && b >= 2 {
		i := (b - 2) % stamps
		w.oldOwn += w.young[i]
		w.young[i] = 0
	}
	w.oldCap = w.ActiveJobs
	r.beatCounts(w)
	r.rebalance(w.pool, w)
	own := w.InFlight() - w.Others - w.Foreign
	w.Foreign = max(0, w.ActiveJobs-own-w.Others)
}

// percent clamps a reported percentage so a bad heartbeat (NaN, negative)
// cannot break the heap order.
func percent(v float32) float32 {
	if v != v || v < 0 { // NaN or negative
		return 0
	}
	return float32(math.Min(float64(v), 100))
}

func (r *Registry) learnInterval(w *Worker, now, sent time.Time) {
	at := now
	if !sent.IsZero() {
		at = sent
	}
	last := w.lastBeat
	w.lastBeat = at
	if !sent.IsZero() != w.sentClock {
		// The clock changed (the worker began or stopped stamping its
		// packets): gaps across the change mean nothing.
		w.sentClock = !sent.IsZero()
		last = time.Time{}
	}
	if s := w.Labels[LabelHeartbeatInterval]; s != "" {
		if d, err := time.ParseDuration(s); err == nil && d > 0 {
			w.Interval, w.steady = d, d
			return
		}
	}
	if last.IsZero() {
		return
	}
	gap := at.Sub(last)
	if gap <= 0 {
		return
	}
	w.gaps[w.gapPos] = gap
	w.gapPos = (w.gapPos + 1) % gapWindow
	if w.nGaps < gapWindow {
		w.nGaps++
	}
	if w.nGaps < minGapsToLearn {
		return
	}
	longest := w.gaps[0]
	for _, g := range w.gaps[1:w.nGaps] {
		longest = max(longest, g)
	}
	w.Interval = longest
	w.steady = 0
	if w.nGaps == gapWindow {
		w.steady = secondShortest(w.gaps)
	}
}

// secondShortest is the steady interval of a full window of gaps: the
// second shortest. A worker whose ticker fired late (its process busy)
// sends that beat late and the next on time, a long gap and then a short
// one; the shortest gap alone would take the short one for its interval
// and find a worker beating too seldom fast enough. A lost heartbeat or a
// pause lengthens one gap, so three of four lengthened are needed to
// call a healthy worker slow.
func secondShortest(gaps [gapWindow]time.Duration) time.Duration {
	first, second := gaps[0], gaps[1]
	if second < first {
		first, second = second, first
	}
	for _, g := range gaps[2:] {
		switch {
		case g < first:
			first, second = g, first
		case g < second:
			second = g
		}
	}
	return second
}

// ttlFor is the worker's liveness window: the configured TTL, shortened to
// MissedIntervals(+½) intervals when the interval is known.
func (r *Registry) ttlFor(w *Worker) time.Duration {
	if w.Interval <= 0 {
		return r.ttl
	}
	t := w.Interval*MissedIntervals + w.Interval/2
	t = max(t, LearnedTTLFloor)
	return min(t, r.ttl)
}

// Window is w's liveness window: how long it may stay silent before it is
// stale.
func (r *Registry) Window(w *Worker) time.Duration { return r.ttlFor(w) }

// Get returns a worker by id, or nil.
func (r *Registry) Get(id string) *Worker { return r.workers[id] }

// Reprieve gives every worker a full liveness window from now, unless its
// deadline is later already, and returns how many it moved: the caller
// could hear no heartbeat until now (its own connection was down), so a
// worker's silence up to now says nothing about the worker.
func (r *Registry) Reprieve(now time.Time) int {
	n := 0
	for _, w := range r.workers {
		if d := now.Add(r.ttlFor(w)); w.deadline.Before(d) {
			w.deadline = d
			n++
		}
	}
	return n
}

// Live reports whether w is within its liveness window at now.
func (r *Registry) Live(w *Worker, now time.Time) bool { return now.Before(w.deadline) }

// Overloaded reports whether w is overloaded under its pool's thresholds.
func (r *Registry) Overloaded(w *Worker) bool {
	if w.pool == nil {
		return w.Overloaded()
	}
	return w.overloadedBy(w.pool.th)
}

// Pool returns the workers of pool (live or not yet swept). The slice is the
// registry's own: callers must not keep or modify it.
func (r *Registry) Pool(pool string) []*Worker {
	if p := r.pools[pool]; p != nil {
		return p.members
	}
	return nil
}

// Pools returns the names of pools that have workers, sorted.
func (r *Registry) Pools() []string {
	out := make([]string, 0, len(r.pools))
	for name := range r.pools {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Top returns pool's first eligible worker in placement order (see
// Worker.Before), or nil. Eligible means neither overloaded nor known
// stale; the worker may still be past its deadline, which the caller
// checks at pick time (and reports with MarkStale).
func (r *Registry) Top(pool string) *Worker {
	if p := r.pools[pool]; p != nil {
		return p.top()
	}
	return nil
}

// OverloadedCount is how many of pool's workers are held out as overloaded.
func (r *Registry) OverloadedCount(pool string) int {
	if p := r.pools[pool]; p != nil {
		return p.overloaded
	}
	return 0
}

// AwayCount is how many of pool's workers another replica places jobs on.
func (r *Registry) AwayCount(pool string) int {
	if p := r.pools[pool]; p != nil {
		return p.away
	}
	return 0
}

// StaleCount is how many of pool's workers were found stale at pick time
// and wait for a heartbeat or the sweep.
func (r *Registry) StaleCount(pool string) int {
	if p := r.pools[pool]; p != nil {
		return p.stale
	}
	return 0
}

// MarkStale takes w out of placement until its next heartbeat. The router
// calls it when a pick lands on a worker past its deadline, so later picks
// do not meet it again.
func (r *Registry) MarkStale(w *Worker) {
	if w.pool != nil {
		r.place(w, placedStale)
	}
}

// CountDispatch records one job sent to w without naming it: it raises w's
// score so the next pick prefers a less loaded worker, and may make w
// overloaded. CountDone takes it back. Jobs the node tracks by id go
// through Occupy and Vacate instead.
func (r *Registry) CountDispatch(w *Worker) {
	w.Dispatched++
	r.reload(w)
}

// CountDone takes back one CountDispatch.
func (r *Registry) CountDone(w *Worker) {
	if w.Dispatched <= 0 {
		return
	}
	w.Dispatched--
	r.reload(w)
}

// Occupy records that job holds a slot of w (it was placed there, or this
// node adopted it there). It reports false, changing nothing, when the job
// is already counted on w.
func (r *Registry) Occupy(w *Worker, job string) bool {
	if _, ok := w.jobs[job]; ok {
		return false
	}
	if w.jobs == nil {
		w.jobs = make(map[string]uint32)
	}
	if w.Reports {
		s := w.stamp()
		w.jobs[job] = s
		w.young[s%stamps]++
	} else {
		w.jobs[job] = jobUnsent
	}
	w.Dispatched++
	r.reload(w)
	return true
}

// Unstarted reports whether job occupies a slot of w and has not started
// (it is one of Waiting's).
func (r *Registry) Unstarted(w *Worker, job string) bool {
	m, ok := w.jobs[job]
	return ok && m&jobStarted == 0
}

// Start marks an occupying job as started: it is running at the worker, so
// the worker's eviction need not place it again (see Waiting).
//
// A job on a worker that does not report its start (Reports false) ages
// (reconcile, poolcount.go) only from here: the router places it, and its
// job publishes it only once its dispatch is durable, then says it started
// on delivery. That write may outlast the two heartbeats (three rounds of
// its pool) that make a job old; aged from its placement, the job was old
// before any worker could hold it, heartbeats of 0 active jobs freed its
// slot, and every replica placed more jobs on the slot it was about to
// fill. Until then it stays counted (until its answer, its return, or its
// end). now is when it started: on a pool subject, a heartbeat sent before
// then does not count toward its age (beatCounts), though this node reads
// it after (heartbeats queued while this node was slow, read in a burst).
func (r *Registry) Start(w *Worker, job string, now time.Time) {
	m, ok := w.jobs[job]
	if !ok {
		return
	}
	if m&jobUnsent == 0 {
		w.jobs[job] = m | jobStarted
		return
	}
	s := w.stamp()
	w.jobs[job] = s | jobStarted
	w.young[s%stamps]++
	if w.shared && now.After(w.pool.startedAt) {
		w.pool.startedAt = now
	}
}

// Vacate frees job's slot on w: its answer was seen, or it ended or went
// back to be placed again. It reports whether the job was counted on w.
func (r *Registry) Vacate(w *Worker, job string) bool {
	m, ok := w.jobs[job]
	if !ok {
		return false
	}
	delete(w.jobs, job)
	delete(w.linger, job)
	w.Dispatched--
	switch placed := m &^ jobStarted; {
	case m&jobUnsent != 0: // in no age bucket
	case !w.isOld(placed):
		w.young[placed%stamps]--
	default:
		if w.oldOwn--; w.shared {
			r.vacateShared(w)
		}
	}
	r.reload(w)
	return true
}

// LingerFor bounds how long a job that ended without its worker's answer
// stays in the worker's job set (Linger). Its slot is counted right well
// before that — the worker's heartbeats stop counting it within two
// intervals (three on a pool subject) — so this only bounds the memory of jobs never answered.
const LingerFor = 5 * time.Minute

// Linger keeps job counted on w as started until the worker answers for it
// (Vacate) or until, at a heartbeat after until, it is dropped.
func (r *Registry) Linger(w *Worker, job string, until time.Time) {
	if _, ok := w.jobs[job]; !ok {
		return
	}
	r.Start(w, job, time.Time{})
	if w.linger == nil {
		w.linger = map[string]time.Time{}
	}
	w.linger[job] = until
}

// Reconciles reports whether w's heartbeats reconcile this node's count
// (it has reported active_jobs > 0): a job of ours it no longer holds
// stops counting within two heartbeats (on a pool subject, three of every
// member of its pool: poolcount.go).
func (r *Registry) Reconciles(w *Worker) bool { return w.reported }

// Waiting returns the jobs occupying w that have not started (the ones
// its eviction should place again).
func (r *Registry) Waiting(w *Worker) []string {
	var out []string
	for id, m := range w.jobs {
		if m&jobStarted == 0 {
			out = append(out, id)
		}
	}
	return out
}

// Jobs lists every job of this node that occupies w, waiting or started.
func (r *Registry) Jobs(w *Worker) []string {
	out := make([]string, 0, len(w.jobs))
	for id := range w.jobs {
		out = append(out, id)
	}
	return out
}

// SetOthers sets what the other replicas have in flight on w.
func (r *Registry) SetOthers(w *Worker, n int32) {
	if n < 0 || n == w.Others {
		return
	}
	// Jobs another replica now reports were, until its report, part of
	// the heartbeat's unexplained rest; do not count them twice.
	if d := n - w.Others; d > 0 {
		w.Foreign = max(0, w.Foreign-d)
	}
	w.Others = n
	r.reload(w)
}

// SetAway says whether another replica owns placement on w: an away
// worker with a max_parallel leaves this registry's placement (Top never
// returns it); one without a limit stays, since there is no count to keep.
func (r *Registry) SetAway(w *Worker, away bool) {
	if w.away == away {
		return
	}
	w.away = away
	if w.pool != nil && w.placed != placedStale {
		r.place(w, r.wanted(w))
	}
}

// Away reports whether another replica owns placement on w (with a limit),
// or this replica has used up its share of w's slots (SetShare).
func (r *Registry) Away(w *Worker) bool { return w.MaxParallel > 0 && (w.away || w.atShare()) }

// SetShare says that of replicas split w's slots and this one is rank
// (0-based) among them: it may count at most Share(w) jobs of its own on w,
// where the shares of all of them add up to w's max_parallel. of ≤ 1: no
// split. Past its share w leaves this registry's placement, as an away
// worker does, until one of its jobs there ends.
func (r *Registry) SetShare(w *Worker, rank, of int) {
	if int(w.shareRank) == rank && int(w.shareOf) == of {
		return
	}
	w.shareRank, w.shareOf = int32(rank), int32(of)
	if w.pool != nil && w.placed != placedStale {
		r.place(w, r.wanted(w))
	}
}

// Share is this replica's share of w's slots (SetShare), or -1 when they
// are not split (no max_parallel, or one replica).
func (r *Registry) Share(w *Worker) int32 { return w.share() }

func (w *Worker) share() int32 {
	if w.shareOf <= 1 || w.MaxParallel <= 0 {
		return -1
	}
	q := w.MaxParallel / w.shareOf
	if w.shareRank < w.MaxParallel%w.shareOf {
		q++
	}
	return q
}

// ownCount is this replica's part of InFlight.
func (w *Worker) ownCount() int32 { return max(w.InFlight()-w.Others-w.Foreign, 0) }

// atShare reports whether this replica counts its whole share of w.
func (w *Worker) atShare() bool {
	q := w.share()
	return q >= 0 && w.ownCount() >= q
}

// Room is how many more jobs w may take by its count (0 when full; a
// large number without a max_parallel).
func (r *Registry) Room(w *Worker) int32 {
	if w.MaxParallel <= 0 {
		return 1 << 20
	}
	th := ActiveRatioDefault
	if w.pool != nil {
		th = w.pool.th.ActiveRatio
	}
	limit := int32(math.Ceil(th*float64(w.MaxParallel) - 1e-9))
	room := limit - w.InFlight()
	if q := w.share(); q >= 0 {
		room = min(room, q-w.ownCount())
	}
	return max(room, 0)
}

// HasRoom reports whether w may take a job now: placed (neither overloaded
// nor known stale). Liveness is the caller's check.
func (r *Registry) HasRoom(w *Worker) bool { return w.pool != nil && w.placed == placedHeap }

// reload re-sorts w after its count changed and moves it between the heap
// and the overloaded set as its room says.
func (r *Registry) reload(w *Worker) {
	if w.pool == nil {
		return
	}
	r.rekey(w)
	if w.placed == placedStale {
		return
	}
	r.place(w, r.wanted(w))
}

// SetThresholds sets per-pool overload thresholds (pools absent from th get
// the defaults) and re-places every worker under them.
func (r *Registry) SetThresholds(th map[string]Thresholds) {
	r.thresholds = th
	for name, p := range r.pools {
		p.th = th[name].WithDefaults()
		for _, w := range p.members {
			if w.placed != placedStale {
				r.place(w, r.wanted(w))
			}
		}
	}
}

// Len returns the number of known workers.
func (r *Registry) Len() int { return len(r.workers) }

// Sweep removes workers whose liveness window ended at or before now and
// returns them. It also drops label selectors idle for SelectorIdle.
func (r *Registry) Sweep(now time.Time) []*Worker { return r.SweepExcept(now, nil) }

// SweepExcept is Sweep keeping the stale workers hold reports true for
// (nil: none): the caller has no evidence yet that their silence is their
// own (router/eviction.go).
func (r *Registry) SweepExcept(now time.Time, hold func(*Worker) bool) []*Worker {
	r.dropIdleSelectors(now.Add(-SelectorIdle))
	var gone []*Worker
	for id, w := range r.workers {
		if !r.Live(w, now) && (hold == nil || !hold(w)) {
			delete(r.workers, id)
			r.detach(w)
			r.trails.keep(w, now, r.lim.MaxWorkers)
			gone = append(gone, w)
		}
	}
	return gone
}

// LivePerPool counts live workers by pool.
func (r *Registry) LivePerPool(now time.Time) map[string]int {
	out := make(map[string]int, len(r.pools))
	for name, p := range r.pools {
		for _, w := range p.members {
			if r.Live(w, now) {
				out[name]++
			}
		}
	}
	return out
}

func (r *Registry) wanted(w *Worker) placement {
	if w.MaxParallel > 0 && (w.away || w.atShare()) {
		return placedAway
	}
	if w.overloadedBy(w.pool.th) {
		return placedOverloaded
	}
	return placedHeap
}

// rekey gives w a new sort key; place then re-sorts it in every index.
func (r *Registry) rekey(w *Worker) {
	w.score, w.tie = w.Load(), r.rnd.Uint32()
}

func (r *Registry) attach(w *Worker) {
	p := r.pools[w.Pool]
	if p == nil {
		p = &poolIndex{name: w.Pool, th: r.thresholds[w.Pool].WithDefaults()}
		r.pools[w.Pool] = p
	}
	w.pool = p
	w.main = p.add(w)
	w.poolPos = len(p.members)
	p.members = append(p.members, w)
	r.linkSelectors(w)
	r.joinCounts(w, p)
}

func (r *Registry) detach(w *Worker) {
	p := w.pool
	if p == nil {
		return
	}
	r.leaveCounts(w, p)
	r.unlinkSelectors(w)
	r.place(w, placedNone)
	p.release(w.main.id)
	w.main = member{}
	last := len(p.members) - 1
	p.members[w.poolPos] = p.members[last]
	p.members[w.poolPos].poolPos = w.poolPos
	p.members[last] = nil
	p.members = p.members[:last]
	w.pool = nil
	if len(p.members) == 0 {
		delete(r.pools, p.name)
	} else {
		r.afterLeave(p)
	}
}

// place moves w to where in every index it is in. Moving to where it
// already is re-sorts it (its key may have changed).
func (r *Registry) place(w *Worker, where placement) {
	if w.placed == where {
		if where == placedHeap {
			w.main.ix.rekey(w.main.id)
			for _, m := range w.sel {
				m.ix.rekey(m.id)
			}
		}
		return
	}
	w.main.ix.leave(w.main.id, w.placed)
	w.main.ix.enter(w.main.id, where)
	for _, m := range w.sel {
		m.ix.leave(m.id, w.placed)
		m.ix.enter(m.id, where)
	}
	w.placed = where
}
