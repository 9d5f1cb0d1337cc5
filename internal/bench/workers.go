package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/proto/capv1"
)

// fleet is W simulated CAP workers sharing one NATS connection. Each is what a
// CAP SDK worker looks like on the wire — heartbeats on sys.heartbeat, a queue
// subscription on its pool subject (queue group = subject), a JobResult
// published with a core publish on the standard result subject — but does
// no work: it answers SUCCEEDED at once, or after delay. In WorkerDirect mode
// (the default) each also subscribes to worker.<id>.jobs and says so in its
// heartbeat (troupe.dispatch=direct), as Troupe's own worker does; in
// WorkerCAP mode it is a stock CAP SDK worker: pool subject only, no label,
// no progress. The shared connection
// keeps the harness's own cost per job small, since it shares the CPU with the
// node under test.
//
// Each worker announces maxPar as its max_parallel_jobs and counts, as a
// real worker would see them, the jobs it holds (received, not yet
// answered: what its heartbeat reports as active_jobs), its peak, and the
// receipts that arrived while it already held maxPar or more (overfills).
// It never refuses a job: the bench measures whether the node keeps to
// the stated capacity, not what a worker does when it does not.
type fleet struct {
	// Immutable after startFleet.
	nc      *nats.Conn
	subj    bus.Subjects
	ids     []string
	pool    string
	topic   string
	delay   time.Duration
	maxPar  int32 // announced max_parallel_jobs; 0: no stated limit
	stock   bool  // stock CAP workers: pool subject only, no dispatch label
	tracker *tracker

	// Shared and safe.
	active    []atomic.Int32 // jobs a worker holds (received, not yet answered)
	peak      []atomic.Int32 // most jobs a worker held at once since resetCapacity
	overfills atomic.Int64   // receipts while the worker held ≥ maxPar (maxPar > 0)
	perWkr    []atomic.Int64 // receipts per worker
	pubErrs   atomic.Int64

	subs   []*nats.Subscription
	stop   chan struct{}
	wg     sync.WaitGroup
	timers sync.WaitGroup // delayed answers still pending

	// Concurrency keys (setKeys): the jobs of each key held at once by all
	// workers together, its peak, and the receipts that found their key
	// already holding keyLimit or more (key overfills).
	keyLimit   int32
	keyActive  []atomic.Int32
	keyPeak    atomic.Int32
	keyOverAll atomic.Int64
	// keyGaps: per key, the answer times (tracker.now) not yet followed by
	// a receipt of the key; each receipt takes the oldest and records the
	// gap from that answer to itself (the hand-off of a slot).
	keyGapMu sync.Mutex
	keyFreed [][]int64
	keyGaps  []int64
	// keyFrom: when the measured run began; keyLate: the gaps of receipts
	// keyLateAfter or more later (past the submit burst).
	keyFrom int64
	keyLate []int64

	// hold: measured jobs are held, unanswered, until releaseHeld.
	hold   atomic.Bool
	heldMu sync.Mutex
	held   []heldJob
}

// heldJob is a request a worker holds in a hold run.
type heldJob struct {
	w, i  int
	trace string
	id    string
}

// workerIDPrefix names simulated workers bw0, bw1, ...: no '.', so each id is
// one token of worker.<id>.jobs.
const workerIDPrefix = "bw"

func workerIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = workerIDPrefix + strconv.Itoa(i)
	}
	return ids
}

// startFleet starts n simulated workers announcing maxPar (0: no limit) and
// sends their first heartbeat.
func startFleet(nc *nats.Conn, subj bus.Subjects, n int, pool, topic string, delay, heartbeat time.Duration,
	maxPar int32, mode WorkerMode, tr *tracker, keys, keyLimit int) (*fleet, error) {
	f := &fleet{nc: nc, subj: subj, ids: workerIDs(n), pool: pool, topic: topic, delay: delay, maxPar: maxPar,
		stock:   mode == WorkerCAP,
		tracker: tr, active: make([]atomic.Int32, n), peak: make([]atomic.Int32, n), perWkr: make([]atomic.Int64, n),
		stop: make(chan struct{})}
	if keys > 0 {
		f.setKeys(keys, keyLimit)
	}
	poolSubj := subj.Pool(topic)
	for w := range f.ids {
		handler := func(m *nats.Msg) { f.onRequest(w, m) }
		qs, err := nc.QueueSubscribe(poolSubj, poolSubj, handler)
		if err != nil {
			f.close()
			return nil, fmt.Errorf("bench: worker %s: subscribe %s: %w", f.ids[w], poolSubj, err)
		}
		subs := []*nats.Subscription{qs}
		if !f.stock {
			ds, err := nc.Subscribe(subj.Worker(f.ids[w]), handler)
			if err != nil {
				_ = qs.Unsubscribe()
				f.close()
				return nil, fmt.Errorf("bench: worker %s: subscribe direct: %w", f.ids[w], err)
			}
			subs = append(subs, ds)
		}
		// A burst at full speed can put tens of thousands of requests on one
		// worker before it answers; the default pending limit (512k
		// messages) is ample, but bytes are capped at 64 MiB — lift both so
		// the harness never drops a request as a slow consumer.
		for _, s := range subs {
			_ = s.SetPendingLimits(-1, -1)
		}
		f.subs = append(f.subs, subs...)
	}
	if err := nc.Flush(); err != nil {
		f.close()
		return nil, fmt.Errorf("bench: workers flush: %w", err)
	}
	f.beat()
	f.wg.Add(1)
	go f.heartbeats(heartbeat)
	return f, nil
}

// beat publishes one heartbeat per worker: its stated max_parallel_jobs
// (as an SDK worker states its own, 64 by default) and the jobs it holds now.
func (f *fleet) beat() {
	labels := map[string]string{registry.LabelDispatch: registry.DispatchDirect}
	if f.stock {
		labels = nil // a stock CAP worker states no dispatch mode: the node publishes on the pool subject
	}
	for w, id := range f.ids {
		data, err := bus.EncodeHeartbeat(id, &capv1.Heartbeat{
			WorkerId: id, Pool: f.pool, Type: "troupe-bench", ActiveJobs: f.active[w].Load(),
			MaxParallelJobs: f.maxPar, Capabilities: []string{f.topic}, Labels: labels,
		})
		if err == nil {
			_ = f.nc.Publish(f.subj.Heartbeat, data)
		}
	}
}

func (f *fleet) heartbeats(every time.Duration) {
	defer f.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
			f.beat()
		}
	}
}

// onRequest is the hot path of a simulated worker: note the receipt time
// first (before decoding, so the harness's own decode is not billed to the
// node), then answer. The job counts as held from its receipt until the
// worker answers it, instant answers included.
func (f *fleet) onRequest(w int, m *nats.Msg) {
	at := f.tracker.now()
	pkt, err := bus.Decode(m.Data)
	req := pkt.GetJobRequest()
	if err != nil || req == nil {
		f.tracker.badPackets.Add(1)
		return
	}
	f.perWkr[w].Add(1)
	f.take(w)
	k := f.takeKey(req)
	if k >= 0 {
		f.keyGap(k, at)
	}
	i := f.tracker.markReceived(req.JobId, at)
	if i >= 0 && f.hold.Load() {
		f.heldMu.Lock()
		f.held = append(f.held, heldJob{w: w, i: i, trace: pkt.TraceId, id: req.JobId})
		f.heldMu.Unlock()
		return
	}
	// The job stops counting as held when the worker answers, before the
	// answer goes out: a node may free the slot and send the next job as
	// soon as it reads the answer, and that receipt must not find this job
	// still counted (a real worker's slot is free once it has answered).
	if f.delay <= 0 {
		f.active[w].Add(-1)
		f.releaseKey(k)
		f.keyFreedAt(k, f.tracker.now())
		f.answer(w, i, pkt.TraceId, req.JobId)
		return
	}
	f.timers.Add(1)
	time.AfterFunc(f.delay, func() {
		defer f.timers.Done()
		f.active[w].Add(-1)
		f.releaseKey(k)
		f.keyFreedAt(k, f.tracker.now())
		f.answer(w, i, pkt.TraceId, req.JobId)
	})
}

// setKeys makes the workers count the jobs of n concurrency keys named
// keyName(0..n-1) against limit (before the first request).
func (f *fleet) setKeys(n, limit int) {
	f.keyActive = make([]atomic.Int32, n)
	f.keyLimit = int32(limit)
	f.keyFreed = make([][]int64, n)
}

// keyGap notes key k's receipt at `at`: the gap from the oldest answer of
// the key not yet followed by a receipt (none: the key had a free slot).
func (f *fleet) keyGap(k int, at int64) {
	f.keyGapMu.Lock()
	if q := f.keyFreed[k]; len(q) > 0 {
		f.keyGaps = append(f.keyGaps, at-q[0])
		if at-f.keyFrom >= int64(keyLateAfter) {
			f.keyLate = append(f.keyLate, at-q[0])
		}
		f.keyFreed[k] = q[1:]
	}
	f.keyGapMu.Unlock()
}

// keyLateAfter: gaps of receipts this long after the measured run began
// are also counted apart (keyLateGaps), past the submit burst.
const keyLateAfter = 20 * time.Second

// keyLateGaps returns the count and mean in ms of the gaps of receipts
// keyLateAfter or more into the measured run.
func (f *fleet) keyLateGaps() (n int, meanMs float64) {
	f.keyGapMu.Lock()
	defer f.keyGapMu.Unlock()
	if len(f.keyLate) == 0 {
		return 0, 0
	}
	var sum int64
	for _, v := range f.keyLate {
		sum += v
	}
	return len(f.keyLate), math.Round(float64(sum/int64(len(f.keyLate)))/1e4) / 100
}

// keyFreedAt notes key k's answer at `at` (k < 0: none).
func (f *fleet) keyFreedAt(k int, at int64) {
	if k < 0 {
		return
	}
	f.keyGapMu.Lock()
	f.keyFreed[k] = append(f.keyFreed[k], at)
	f.keyGapMu.Unlock()
}

// keyGapStats returns the count and the mean, p50, p90, p99 and max in ms
// of the gaps from a key's answer to its next receipt, since resetCapacity.
func (f *fleet) keyGapStats() (n int, meanMs, p50, p90, p99, maxMs float64) {
	f.keyGapMu.Lock()
	g := slices.Clone(f.keyGaps)
	f.keyGapMu.Unlock()
	if len(g) == 0 {
		return 0, 0, 0, 0, 0, 0
	}
	slices.Sort(g)
	var sum int64
	for _, v := range g {
		sum += v
	}
	ms := func(v int64) float64 { return math.Round(float64(v)/1e4) / 100 }
	q := func(p float64) float64 { return ms(g[min(len(g)-1, int(p*float64(len(g))))]) }
	return len(g), ms(sum / int64(len(g))), q(0.5), q(0.9), q(0.99), ms(g[len(g)-1])
}

// takeKey counts a receipt against its job's concurrency key, if it has one
// of the run's keys: an overfill when the key's jobs already held by the
// workers were at the limit or more. It returns the key's index, or -1.
func (f *fleet) takeKey(req *capv1.JobRequest) int {
	if len(f.keyActive) == 0 {
		return -1
	}
	k := keyIndex(req.GetMeta().GetLabels()[labelConcurrencyKey], len(f.keyActive))
	if k < 0 {
		return -1
	}
	n := f.keyActive[k].Add(1)
	if n-1 >= f.keyLimit {
		f.keyOverAll.Add(1)
	}
	for {
		p := f.keyPeak.Load()
		if n <= p || f.keyPeak.CompareAndSwap(p, n) {
			return k
		}
	}
}

// releaseKey counts key k's job as answered (k < 0: none).
func (f *fleet) releaseKey(k int) {
	if k >= 0 {
		f.keyActive[k].Add(-1)
	}
}

// keyCapacity returns the most jobs of one key held at once and the key
// overfills, since resetCapacity.
func (f *fleet) keyCapacity() (maxHeld int32, overfills int64) {
	return f.keyPeak.Load(), f.keyOverAll.Load()
}

// take counts a receipt by worker w as a job it holds: an overfill when it
// already held maxPar or more, and a new peak when it holds more than ever.
func (f *fleet) take(w int) {
	n := f.active[w].Add(1)
	if f.maxPar > 0 && n-1 >= f.maxPar {
		f.overfills.Add(1)
	}
	for {
		p := f.peak[w].Load()
		if n <= p || f.peak[w].CompareAndSwap(p, n) {
			return
		}
	}
}

// resetCapacity starts the peak and overfill counts afresh (at the start of
// the measured run: the warm-up is not counted).
func (f *fleet) resetCapacity() {
	for w := range f.peak {
		f.peak[w].Store(f.active[w].Load())
	}
	f.overfills.Store(0)
	var kp int32
	for k := range f.keyActive {
		kp = max(kp, f.keyActive[k].Load())
	}
	f.keyPeak.Store(kp)
	f.keyOverAll.Store(0)
	f.keyGapMu.Lock()
	f.keyGaps, f.keyLate = nil, nil
	if f.tracker != nil {
		f.keyFrom = f.tracker.now()
	}
	for k := range f.keyFreed {
		f.keyFreed[k] = nil
	}
	f.keyGapMu.Unlock()
}

// capacity returns the highest peak of any worker and the overfills of all,
// since resetCapacity.
func (f *fleet) capacity() (maxHeld int32, overfills int64) {
	for w := range f.peak {
		maxHeld = max(maxHeld, f.peak[w].Load())
	}
	return maxHeld, f.overfills.Load()
}

// answer publishes a SUCCEEDED JobResult, as a CAP worker does: core
// publish; the result stream captures the subject.
func (f *fleet) answer(w, i int, trace, jobID string) {
	data, err := f.encodeResult(w, trace, jobID)
	if err == nil {
		err = f.nc.Publish(f.subj.Result, data)
	}
	if err != nil {
		f.pubErrs.Add(1)
		return
	}
	if i >= 0 {
		f.tracker.markAnswered(i)
	}
}

// Releasing held jobs: a million answers at once outrun the node's intake,
// and the result stream refuses publishes once it holds StreamMaxMsgs
// (DiscardNew). A CAP worker whose result publish is refused must publish it
// again, so the release publishes with JetStream acks, at most releaseWindow
// awaiting theirs, and publishes a refused answer again after a backoff
// (releaseBackoffMin doubling to releaseBackoffMax) until it is stored.
const (
	releaseWindow     = 4096
	releaseBackoffMin = 50 * time.Millisecond
	releaseBackoffMax = 2 * time.Second
	// releaseMaxStalls bounds the windows in a row in which some answer was
	// refused (about 40 minutes at releaseBackoffMax) before the release gives up.
	releaseMaxStalls = 1200
)

// encodeResult is worker w's SUCCEEDED JobResult for jobID.
func (f *fleet) encodeResult(w int, trace, jobID string) ([]byte, error) {
	return bus.EncodeResult(trace, f.ids[w], &capv1.JobResult{
		JobId: jobID, Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, WorkerId: f.ids[w],
		ResultPtr: "redis://res:" + jobID, ExecutionMs: f.delay.Milliseconds(),
	})
}

// releaseHeld stops holding and answers every held job with acknowledged
// publishes, publishing refused answers again (see releaseWindow). It returns
// how many jobs it answered, how many publishes were refused along the way,
// and an error when ctx ended or the stream refused for too long.
func (f *fleet) releaseHeld(ctx context.Context) (answered int, refused int64, err error) {
	f.hold.Store(false)
	f.heldMu.Lock()
	held := f.held
	f.held = nil
	f.heldMu.Unlock()
	for _, h := range held {
		f.active[h.w].Add(-1)
	}
	js, err := jetstream.New(f.nc, jetstream.WithPublishAsyncMaxPending(2*releaseWindow),
		jetstream.WithPublishAsyncTimeout(submitAckTimeout))
	if err != nil {
		return 0, 0, fmt.Errorf("bench: release: %w", err)
	}
	var again []heldJob // refused answers, published before the rest
	next := 0
	backoff, stalls := releaseBackoffMin, 0
	type pending struct {
		h   heldJob
		ack jetstream.PubAckFuture
	}
	window := make([]pending, 0, releaseWindow)
	for len(again) > 0 || next < len(held) {
		if ctx.Err() != nil {
			return answered, refused, fmt.Errorf("bench: release: %d answers not yet stored: %w",
				len(again)+len(held)-next, ctx.Err())
		}
		window = window[:0]
		var retry []heldJob
		for len(window) < releaseWindow && (len(again) > 0 || next < len(held)) {
			var h heldJob
			if len(again) > 0 {
				h, again = again[0], again[1:]
			} else {
				h, next = held[next], next+1
			}
			data, eerr := f.encodeResult(h.w, h.trace, h.id)
			if eerr != nil {
				f.pubErrs.Add(1)
				continue
			}
			ack, perr := js.PublishAsync(f.subj.Result, data)
			if perr != nil {
				retry = append(retry, h)
				continue
			}
			window = append(window, pending{h: h, ack: ack})
		}
		for _, p := range window {
			select {
			case <-p.ack.Ok():
				answered++
				if p.h.i >= 0 {
					f.tracker.markAnswered(p.h.i)
				}
			case <-p.ack.Err():
				retry = append(retry, p.h)
			case <-ctx.Done():
				return answered, refused, fmt.Errorf("bench: release: waiting for acks: %w", ctx.Err())
			}
		}
		if len(retry) == 0 {
			backoff, stalls = releaseBackoffMin, 0
			continue
		}
		refused += int64(len(retry))
		again = append(retry, again...)
		if stalls++; stalls > releaseMaxStalls {
			return answered, refused, fmt.Errorf("bench: release: the result stream refused answers %d windows in a row; %d not stored",
				stalls, len(again)+len(held)-next)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
		}
		backoff = min(2*backoff, releaseBackoffMax)
	}
	return answered, refused, nil
}

// perWorker returns the receipts of each worker.
func (f *fleet) perWorker() []int64 {
	out := make([]int64, len(f.perWkr))
	for i := range f.perWkr {
		out[i] = f.perWkr[i].Load()
	}
	return out
}

// close unsubscribes and stops heartbeating; delayed answers still pending
// are sent (bounded by the delay).
func (f *fleet) close() {
	for _, s := range f.subs {
		_ = s.Unsubscribe()
	}
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	f.wg.Wait()
	f.timers.Wait()
}
