package bench

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

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
	maxPar int32, mode WorkerMode, tr *tracker) (*fleet, error) {
	f := &fleet{nc: nc, subj: subj, ids: workerIDs(n), pool: pool, topic: topic, delay: delay, maxPar: maxPar,
		stock:   mode == WorkerCAP,
		tracker: tr, active: make([]atomic.Int32, n), peak: make([]atomic.Int32, n), perWkr: make([]atomic.Int64, n),
		stop: make(chan struct{})}
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
		f.answer(w, i, pkt.TraceId, req.JobId)
		return
	}
	f.timers.Add(1)
	time.AfterFunc(f.delay, func() {
		defer f.timers.Done()
		f.active[w].Add(-1)
		f.answer(w, i, pkt.TraceId, req.JobId)
	})
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
	data, err := bus.EncodeResult(trace, f.ids[w], &capv1.JobResult{
		JobId: jobID, Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, WorkerId: f.ids[w],
		ResultPtr: "redis://res:" + jobID, ExecutionMs: f.delay.Milliseconds(),
	})
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

// releaseHeld stops holding and answers every held job; it returns how many.
func (f *fleet) releaseHeld() int {
	f.hold.Store(false)
	f.heldMu.Lock()
	held := f.held
	f.held = nil
	f.heldMu.Unlock()
	for _, h := range held {
		f.active[h.w].Add(-1)
		f.answer(h.w, h.i, h.trace, h.id)
	}
	_ = f.nc.Flush()
	return len(held)
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
