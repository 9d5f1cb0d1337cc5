package troupe_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/proto/capv1"
)

// capWorker is what a stock CAP SDK worker looks like to Troupe: it takes
// jobs on the pool subject (queue group = subject) — and, with direct, on
// its own worker.<id>.jobs, labelled so Troupe uses it — announces
// max_parallel_jobs and its active_jobs in heartbeats, sends no progress,
// and answers with a JobResult. It counts, as the worker sees it, how many
// jobs it holds at once and how many arrived while it was already full.
type capWorker struct {
	t      testing.TB
	nc     *nats.Conn
	subj   bus.Subjects
	id     string
	max    int32
	direct bool
	// answer decides when a job is answered: nil answers at once;
	// otherwise it blocks until the job is to be answered, and returns
	// false to drop the job unanswered.
	answer func(jobID string) bool

	held      atomic.Int32
	maxHeld   atomic.Int32
	overfills atomic.Int64
	received  atomic.Int64
	got       chan string
	stop      chan struct{}
	wg        sync.WaitGroup
	// mu orders onJob's wg.Add before close's wg.Wait: a NATS callback may
	// still run after Unsubscribe returns.
	mu        sync.Mutex
	closed    bool
	sub, dsub *nats.Subscription
}

func startCapWorker(t testing.TB, nc *nats.Conn, subj bus.Subjects, id string, maxParallel int32,
	beat time.Duration, answer func(string) bool) *capWorker {
	t.Helper()
	return startCapWorkerMode(t, nc, subj, id, maxParallel, beat, answer, false)
}

func startCapWorkerMode(t testing.TB, nc *nats.Conn, subj bus.Subjects, id string, maxParallel int32,
	beat time.Duration, answer func(string) bool, direct bool) *capWorker {
	t.Helper()
	w := &capWorker{t: t, nc: nc, subj: subj, id: id, max: maxParallel, answer: answer, direct: direct,
		got: make(chan string, 100000), stop: make(chan struct{})}
	var err error
	topic := subj.Pool("job.echo")
	if w.sub, err = nc.QueueSubscribe(topic, topic, w.onJob); err != nil {
		t.Fatal(err)
	}
	_ = w.sub.SetPendingLimits(-1, -1)
	if w.direct {
		if w.dsub, err = nc.Subscribe(subj.Worker(id), w.onJob); err != nil {
			t.Fatal(err)
		}
		_ = w.dsub.SetPendingLimits(-1, -1)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	w.heartbeat()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		tk := time.NewTicker(beat)
		defer tk.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tk.C:
				w.heartbeat()
			}
		}
	}()
	t.Cleanup(w.close)
	return w
}

func (w *capWorker) close() {
	select {
	case <-w.stop:
		return
	default:
	}
	close(w.stop)
	_ = w.sub.Unsubscribe()
	if w.dsub != nil {
		_ = w.dsub.Unsubscribe()
	}
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	// A job whose answer func still blocks (a gate a failed test never
	// opened, held for an hour) must not hang the package until its
	// timeout, which would hide the failure's own message.
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		w.t.Errorf("worker %s: jobs still held 10 s after it closed (their answers block)", w.id)
	}
}

func (w *capWorker) heartbeat() {
	data, err := bus.EncodeHeartbeat(w.id, &capv1.Heartbeat{WorkerId: w.id, Pool: "echo",
		ActiveJobs: w.held.Load(), MaxParallelJobs: w.max, Capabilities: []string{"job.echo"},
		Labels: w.labels()})
	if err == nil {
		_ = w.nc.Publish(w.subj.Heartbeat, data)
	}
}

func (w *capWorker) labels() map[string]string {
	l := map[string]string{registry.LabelHeartbeatInterval: "5s"}
	if w.direct {
		l[registry.LabelDispatch] = registry.DispatchDirect
	}
	return l
}

func (w *capWorker) onJob(m *nats.Msg) {
	pkt, err := bus.Decode(m.Data)
	req := pkt.GetJobRequest()
	if err != nil || req == nil {
		return
	}
	n := w.held.Add(1)
	if w.max > 0 && n > w.max {
		w.overfills.Add(1)
	}
	for {
		old := w.maxHeld.Load()
		if n <= old || w.maxHeld.CompareAndSwap(old, n) {
			break
		}
	}
	w.received.Add(1)
	w.got <- req.JobId
	if w.answer == nil {
		w.reply(pkt.TraceId, req.JobId)
		return
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.wg.Add(1)
	w.mu.Unlock()
	go func() {
		defer w.wg.Done()
		if w.answer(req.JobId) {
			w.reply(pkt.TraceId, req.JobId)
		} else {
			w.held.Add(-1)
		}
	}()
}

// reply publishes SUCCEEDED. The job stops counting as held before the
// result goes out, as a worker frees its slot when its handler returns.
func (w *capWorker) reply(trace, jobID string) {
	w.held.Add(-1)
	data, err := bus.EncodeResult(trace, w.id, &capv1.JobResult{JobId: jobID,
		Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, WorkerId: w.id})
	if err == nil {
		err = w.nc.Publish(w.subj.Result, data)
	}
	if err != nil {
		w.t.Errorf("worker %s: result of %s: %v", w.id, jobID, err)
	}
}

// waitGot waits (bounded) for the worker to receive a job, and returns its id.
func (w *capWorker) waitGot(within time.Duration) string {
	w.t.Helper()
	select {
	case id := <-w.got:
		return id
	case <-time.After(within):
		w.t.Fatalf("worker %s received nothing in %v", w.id, within)
		return ""
	}
}

// jobGates holds jobs at a capWorker until the test opens their gate: true
// answers the job, false drops it unanswered.
type jobGates struct {
	mu sync.Mutex
	ch map[string]chan bool
}

func newJobGates() *jobGates { return &jobGates{ch: map[string]chan bool{}} }

func (g *jobGates) gate(id string) chan bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.ch[id]
	if c == nil {
		c = make(chan bool, 1)
		g.ch[id] = c
	}
	return c
}

// wait is a capWorker answer func: it blocks until the job's gate opens.
func (g *jobGates) wait(id string) bool { return <-g.gate(id) }

// open lets job id go: answered (true) or dropped.
func (g *jobGates) open(id string, answer bool) { g.gate(id) <- answer }

// fleetCounts sums what the workers counted: receipts over their
// max_parallel, and the most jobs any held at once.
func fleetCounts(ws []*capWorker) (overfills int64, maxHeld int32) {
	for _, w := range ws {
		overfills += w.overfills.Load()
		maxHeld = max(maxHeld, w.maxHeld.Load())
	}
	return overfills, maxHeld
}

// waitReportedActive waits (bounded) until the node's only worker has
// reported n active jobs in a heartbeat.
func (f *fixture) waitReportedActive(n int32) {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ws, err := f.node.Workers()
		if err == nil && len(ws) == 1 && ws[0].ActiveJobs == n {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the node never saw its worker report %d active jobs", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitQueued waits (bounded) until n jobs wait in the node's capacity queue.
func (f *fixture) waitQueued(n float64) {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for counter(f.t, f.node, "troupe_capacity_queue_jobs", "") != n {
		if time.Now().After(deadline) {
			f.t.Fatalf("%v jobs never waited in the queue", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// noBackoff makes a backoff retry impossible to mistake for a wake: the
// first retry would come after an hour.
func noBackoff(c *troupe.Config) { troupe.SetBackoff(c, func(int) time.Duration { return time.Hour }) }

// TestCapacityBurstOnAWorkerOfMaxParallelOne: 200 instant jobs on one
// stock worker that takes one job at a time all succeed — each waits in the
// queue for the slot, none on a backoff (an hour away here) — and the worker
// never holds two. How fast is the bench's figure (BENCHMARKS.md), not this
// test's: its bound only has to be far below the hour.
func TestCapacityBurstOnAWorkerOfMaxParallelOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t, noBackoff)
	w := startCapWorker(t, f.env.NATS, f.subj, "solo", 1, 5*time.Second, nil)
	f.waitWorkers(1)
	const jobs = 200
	for i := range jobs {
		f.submit(echoReq("burst-" + strconv.Itoa(i)))
	}
	last := time.Now()
	for i := range jobs {
		f.waitStateWithin("burst-"+strconv.Itoa(i), jobstate.StateSucceeded, time.Minute-time.Since(last)+time.Millisecond)
	}
	t.Logf("200 jobs on max_parallel 1: all SUCCEEDED %v after the last submit; worker held at most %d",
		time.Since(last).Round(time.Millisecond), w.maxHeld.Load())
	if got := w.maxHeld.Load(); got != 1 {
		t.Fatalf("worker held %d jobs at once, want 1 (max_parallel 1)", got)
	}
	if n := counter(t, f.node, "troupe_scheduling_retries_total", string(jobstate.ReasonPoolOverloaded)); n != 0 {
		t.Fatalf("%v backoff retries for pool_overloaded, want 0 (jobs wait in the queue)", n)
	}
}

// TestCapacitySlotFreesOnTheAnswer: a full worker's slot goes to the next
// waiting job the moment a result is seen — not at the worker's next
// heartbeat (an hour away here) nor on a backoff (also an hour).
func TestCapacitySlotFreesOnTheAnswer(t *testing.T) {
	t.Parallel()
	f := newFixture(t, noBackoff)
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "pair", 2, time.Hour, g.wait)
	f.waitWorkers(1)
	f.submit(echoReq("cap-1"))
	f.submit(echoReq("cap-2"))
	first := map[string]bool{w.waitGot(5 * time.Second): true, w.waitGot(5 * time.Second): true}
	f.submit(echoReq("cap-3"))
	f.waitQueued(1)
	// Waiting within its grace: no record, but the node describes it.
	if _, err := f.node.Job(context.Background(), "cap-3"); err == nil {
		t.Fatal("cap-3 has a record while it waits within its grace")
	}
	wj, err := f.node.WaitingJob(context.Background(), "cap-3")
	if err != nil || wj == nil || wj.Reason != jobstate.ReasonPoolOverloaded || wj.Position != 0 || wj.Node != "node-a" {
		t.Fatalf("cap-3 waiting = %+v, %v; want pool_overloaded at position 0 on node-a", wj, err)
	}
	for id := range first {
		g.open(id, true)
		break
	}
	if got := w.waitGot(5 * time.Second); got != "cap-3" {
		t.Fatalf("worker got %s, want cap-3", got)
	}
	if w.maxHeld.Load() != 2 || w.overfills.Load() != 0 {
		t.Fatalf("worker held at most %d (%d overfills), want 2 and 0", w.maxHeld.Load(), w.overfills.Load())
	}
	if pos, _ := f.node.QueuePosition(context.Background(), "cap-3"); pos != -1 {
		t.Fatalf("queue position of a dispatched job = %d, want -1", pos)
	}
	for id := range first {
		g.open(id, true)
	}
	g.open("cap-3", true)
}

// TestCapacityWaitingJobsWakeWhenAWorkerJoins: jobs with no worker wait
// SCHEDULED no_workers and are placed the moment one heartbeats.
func TestCapacityWaitingJobsWakeWhenAWorkerJoins(t *testing.T) {
	t.Parallel()
	f := newFixture(t, noBackoff)
	for i := range 5 {
		f.submit(echoReq("late-" + strconv.Itoa(i)))
	}
	f.waitQueued(5)
	for i := range 5 {
		if wj, err := f.node.WaitingJob(context.Background(), "late-"+strconv.Itoa(i)); err != nil || wj == nil ||
			wj.Reason != jobstate.ReasonNoWorkers {
			t.Fatalf("late-%d waiting = %+v, %v; want no_workers", i, wj, err)
		}
	}
	startCapWorker(t, f.env.NATS, f.subj, "joiner", 4, time.Hour, nil)
	for i := range 5 {
		f.waitStateWithin("late-"+strconv.Itoa(i), jobstate.StateSucceeded, 5*time.Second)
	}
}

// TestCapacityWorkerRestartFreesItsSlots: a worker that lost its jobs
// (restarted) says so in its heartbeats (active_jobs 0); after a whole
// heartbeat interval the slots those jobs held are free again, long before
// the jobs' dispatch timeout.
func TestCapacityWorkerRestartFreesItsSlots(t *testing.T) {
	t.Parallel()
	f := newFixture(t, noBackoff)
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "amnesiac", 1, 100*time.Millisecond, g.wait)
	f.waitWorkers(1)
	f.submit(echoReq("lost"))
	w.waitGot(5 * time.Second)
	// The node hears the worker hold it (active_jobs 1)…
	f.waitReportedActive(1)
	// …then the worker restarts: the job is gone, never to be answered.
	g.open("lost", false)
	f.submit(echoReq("next"))
	if got := w.waitGot(5 * time.Second); got != "next" {
		t.Fatalf("got %s, want next", got)
	}
	g.open("next", true)
	f.waitStateWithin("next", jobstate.StateSucceeded, 5*time.Second)
	if r := f.waitState("lost", jobstate.StateDispatched); r.Reason != jobstate.ReasonDispatched {
		t.Fatalf("lost: %s %s", r.State, r.Reason)
	}
}

// TestCapacityTwoReplicasShareWorkers: two nodes place jobs on the same
// workers. Each worker has one owning node; the other uses its slots only
// by refilling slots its own jobs freed or by the owner's offers, so no
// worker ever holds more than its max_parallel (as the worker counts), and
// every job succeeds.
func TestCapacityTwoReplicasShareWorkers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, noBackoff)
	a := f.node
	b := newNodeOn(t, f, "node-b", noBackoff)
	f.node = a
	var ws []*capWorker
	for i := range 4 {
		ws = append(ws, startCapWorkerMode(t, f.env.NATS, f.subj, fmt.Sprintf("shared-%d", i), 2, 5*time.Second,
			func(string) bool { time.Sleep(20 * time.Millisecond); return true }, true))
	}
	f.waitWorkers(4)
	// Both nodes agree who places on which worker before the jobs come.
	deadline := time.Now().Add(10 * time.Second)
	for {
		wa, _ := a.Workers()
		wb, _ := b.Workers()
		agree := len(wa) == 4 && len(wb) == 4
		for i := 0; agree && i < 4; i++ {
			agree = wa[i].ID == wb[i].ID && wa[i].Steward == wb[i].Steward
		}
		if agree {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes never agreed on owners: %+v / %+v", wa, wb)
		}
		time.Sleep(10 * time.Millisecond)
	}
	const jobs = 400
	start := time.Now()
	for i := range jobs {
		f.submit(echoReq("two-" + strconv.Itoa(i)))
	}
	for i := range jobs {
		f.waitStateWithin("two-"+strconv.Itoa(i), jobstate.StateSucceeded, 60*time.Second)
	}
	elapsed := time.Since(start)
	over, maxHeld := fleetCounts(ws)
	t.Logf("400 jobs of 20 ms on 4 workers × 2 slots over two nodes: %v (capacity %v), max held %d, overfills %d, node-a waits %v, node-b waits %v",
		elapsed.Round(time.Millisecond), (jobs / 8 * 20 * time.Millisecond).Round(time.Millisecond), maxHeld, over,
		counter(t, a, "troupe_capacity_waits_total", string(jobstate.ReasonPoolOverloaded)),
		counter(t, b, "troupe_capacity_waits_total", string(jobstate.ReasonPoolOverloaded)))
	if over != 0 || maxHeld > 2 {
		t.Fatalf("workers held up to %d jobs (%d of %d receipts over max_parallel 2)", maxHeld, over, jobs)
	}
}

// oneJobWaiting starts a node with an hour's grace and a worker of
// max_parallel 1, gives the worker job first (held at its gate), and
// submits job second, which waits in the queue, unwritten.
func oneJobWaiting(t *testing.T, first, second string) (*fixture, *jobGates, *capWorker) {
	t.Helper()
	f := newFixture(t, func(c *troupe.Config) { noBackoff(c); c.Tuning.CapacityGrace = time.Hour })
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "single", 1, time.Hour, g.wait)
	f.waitWorkers(1)
	f.submit(echoReq(first))
	w.waitGot(5 * time.Second)
	f.submit(echoReq(second))
	f.waitQueued(1)
	return f, g, w
}

// TestCapacityShortWaitWritesNothing: a new job that finds no room but is
// placed within its grace is created and dispatched in one write — no
// SCHEDULED pool_overloaded step in its history, no capacity wait counted.
func TestCapacityShortWaitWritesNothing(t *testing.T) {
	t.Parallel()
	f, g, w := oneJobWaiting(t, "short-1", "short-2")
	// short-2 waits in the router, unwritten: there is no record yet.
	if _, err := f.node.Job(context.Background(), "short-2"); err == nil {
		t.Fatal("short-2 has a record while it waits within its grace")
	}
	g.open("short-1", true)
	if got := w.waitGot(5 * time.Second); got != "short-2" {
		t.Fatalf("got %s, want short-2", got)
	}
	g.open("short-2", true)
	f.succeededWithNoWaitWritten("short-2")
}

// succeededWithNoWaitWritten waits until job SUCCEEDED and checks that its
// wait for room was never written on its own: no capacity wait counted by
// the node, and the history's one pool_overloaded step came with the
// create that dispatched the job (PENDING → SCHEDULED pool_overloaded →
// DISPATCHED), dated from when the wait began.
func (f *fixture) succeededWithNoWaitWritten(job string) {
	f.t.Helper()
	r := f.waitState(job, jobstate.StateSucceeded)
	if len(r.History) < 3 || r.History[1].Reason != jobstate.ReasonPoolOverloaded ||
		r.History[2].To != jobstate.StateDispatched || r.History[1].At.After(r.History[2].At) {
		f.t.Fatalf("%s: history %+v; want PENDING, SCHEDULED pool_overloaded, DISPATCHED", job, r.History)
	}
	for _, h := range r.History[2:] {
		if h.Reason == jobstate.ReasonPoolOverloaded {
			f.t.Fatalf("%s: history has a second pool_overloaded step: %+v", job, r.History)
		}
	}
	if n := counter(f.t, f.node, "troupe_capacity_waits_total", string(jobstate.ReasonPoolOverloaded)); n != 0 {
		f.t.Fatalf("capacity waits written = %v, want 0", n)
	}
}

// TestCapacityCancelWithinTheGrace: a job cancelled while it waits,
// unwritten, is created CANCELLED and never dispatched.
func TestCapacityCancelWithinTheGrace(t *testing.T) {
	t.Parallel()
	f, g, w := oneJobWaiting(t, "busy", "doomed")
	if err := f.node.Cancel(context.Background(), "doomed", "changed my mind", "test"); err != nil {
		t.Fatal(err)
	}
	r := f.waitState("doomed", jobstate.StateCancelled)
	if r.Reason != jobstate.ReasonCancelRequested {
		t.Fatalf("reason %q", r.Reason)
	}
	g.open("busy", true)
	f.submit(echoReq("after"))
	if got := w.waitGot(5 * time.Second); got != "after" {
		t.Fatalf("worker got %s after the cancel, want after (doomed must never be dispatched)", got)
	}
	g.open("after", true)
}

// TestCapacityCancelledJobKeepsItsSlotUntilTheWorkerLetsGo: a stock worker
// hears no cancel, so a job cancelled while it runs there keeps running;
// its slot stays counted until the worker answers, and the next job waits
// for it rather than over-filling the worker.
func TestCapacityCancelledJobKeepsItsSlotUntilTheWorkerLetsGo(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) { noBackoff(c); c.Tuning.CapacityGrace = time.Hour })
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "deaf", 1, 100*time.Millisecond, g.wait)
	f.waitWorkers(1)
	f.submit(echoReq("to-cancel"))
	w.waitGot(5 * time.Second)
	// Its heartbeats report the job (so the node trusts its counts).
	f.waitReportedActive(1)
	if err := f.node.Cancel(context.Background(), "to-cancel", "stop", "test"); err != nil {
		t.Fatal(err)
	}
	f.waitState("to-cancel", jobstate.StateCancelled)
	f.submit(echoReq("next"))
	f.waitQueued(1) // waits: the worker still runs the cancelled job
	g.open("to-cancel", true)
	if got := w.waitGot(5 * time.Second); got != "next" {
		t.Fatalf("got %s, want next", got)
	}
	g.open("next", true)
	f.waitState("next", jobstate.StateSucceeded)
	if w.overfills.Load() != 0 || w.maxHeld.Load() != 1 {
		t.Fatalf("worker held up to %d (%d overfills)", w.maxHeld.Load(), w.overfills.Load())
	}
}

// TestCapacityABurstWaitsInTheStreamAtMaxAdmitting: a node holding
// MaxAdmitting jobs it has taken from the submit stream and neither
// dispatched, written as waiting, nor finished pulls no more submits (a
// pull already waiting still takes up to a fetch batch) — the rest of a
// burst waits in JetStream, not as actors in the node — and takes them as
// its jobs are dispatched. Every job is counted out again: the
// count is back to 0 when all have ended (a duplicate submit included).
func TestCapacityABurstWaitsInTheStreamAtMaxAdmitting(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		noBackoff(c)
		c.Tuning.MaxAdmitting = 10
		c.Tuning.CapacityGrace = time.Minute // queued jobs stay unwritten (and counted) for the test
		c.Tuning.AdmissionHold = time.Hour
	})
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "narrow", 2, time.Hour, g.wait)
	f.waitWorkers(1)
	for i := range 12 { // 2 dispatched, 10 queued within their grace
		f.submit(echoReq("adm-" + strconv.Itoa(i)))
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.node.Admitting() != 10 {
		if time.Now().After(deadline) {
			t.Fatalf("admitting %d, want 10 (12 submitted, 2 dispatched)", f.node.Admitting())
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx := context.Background()
	cons, err := f.js.Consumer(ctx, bus.StreamName(f.env.StreamPrefix(), bus.StreamSubmit), bus.ConsumerName(bus.StreamSubmit))
	if err != nil {
		t.Fatal(err)
	}
	// A pull already waiting at the server when the bound was reached still
	// takes what comes (up to a fetch batch per loop); the hold stops the
	// next pulls. Once none is waiting, nothing more is taken. A pull sent
	// just before the bound may still be on its way to the server (a loaded
	// machine: CI saw one take a submit after a first "none waiting"), so
	// none may be waiting for two fetch waits in a row.
	for idleSince := (time.Time{}); ; time.Sleep(20 * time.Millisecond) {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumWaiting != 0 {
			idleSince = time.Time{}
		} else if idleSince.IsZero() {
			idleSince = time.Now()
		} else if time.Since(idleSince) > 2*bus.FetchMaxWait {
			break
		}
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatalf("%d pulls still waiting at the server while the node is at its bound", info.NumWaiting)
		}
	}
	for i := 12; i < 32; i++ {
		f.submit(echoReq("adm-" + strconv.Itoa(i)))
	}
	// Held: the 20 new submits stay in the stream, un-fetched, while the
	// node is at its bound (checked for longer than a fetch's max wait).
	for end := time.Now().Add(2 * bus.FetchMaxWait); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending != 20 || f.node.Admitting() != 10 {
			t.Fatalf("at the bound: %d submits left in the stream, %d admitting; want 20 and 10",
				info.NumPending, f.node.Admitting())
		}
	}
	for _, id := range []string{w.waitGot(5 * time.Second), w.waitGot(5 * time.Second)} {
		g.open(id, true)
	}
	go func() { // answer every later job as it arrives
		for {
			select {
			case id := <-w.got:
				g.open(id, true)
			case <-w.stop:
				return
			}
		}
	}()
	for i := range 32 {
		f.waitStateWithin("adm-"+strconv.Itoa(i), jobstate.StateSucceeded, 20*time.Second)
	}
	f.submit(echoReq("adm-0")) // a duplicate of a finished job
	deadline = time.Now().Add(10 * time.Second)
	for f.node.Admitting() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("admitting %d after every job ended, want 0", f.node.Admitting())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if w.overfills.Load() != 0 {
		t.Fatalf("%d overfills", w.overfills.Load())
	}
}

// untilCounter polls a node's metric until it reaches at least want (within
// 15 s) and returns it.
func untilCounter(t *testing.T, n *troupe.Node, name string, want float64) float64 {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if v := counter(t, n, name, ""); v >= want {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s stayed below %v", name, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCapacityAWaitPastItsAdmissionHoldStaysUnwritten: a job that waits
// for room longer than its admission hold stops counting in the node's
// admissions (so the submit stream moves on for other pools) but stays
// unwritten — no record, no capacity wait written, its submit held — and
// is created and dispatched in one write when the slot frees.
func TestCapacityAWaitPastItsAdmissionHoldStaysUnwritten(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) { noBackoff(c); c.Tuning.AdmissionHold = 100 * time.Millisecond })
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "single", 1, time.Hour, g.wait)
	f.waitWorkers(1)
	f.submit(echoReq("hold-1"))
	w.waitGot(5 * time.Second)
	f.submit(echoReq("hold-2"))
	f.waitQueued(1)
	deadline := time.Now().Add(5 * time.Second)
	for f.node.Admitting() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("admitting %d a while past the hold, want 0", f.node.Admitting())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := counter(t, f.node, "troupe_capacity_waits_unwritten", ""); n != 1 {
		t.Fatalf("unwritten waits %v, want 1", n)
	}
	if _, err := f.node.Job(context.Background(), "hold-2"); err == nil {
		t.Fatal("hold-2 has a record while it waits within its grace")
	}
	g.open("hold-1", true)
	if got := w.waitGot(5 * time.Second); got != "hold-2" {
		t.Fatalf("got %s, want hold-2", got)
	}
	g.open("hold-2", true)
	f.succeededWithNoWaitWritten("hold-2")
	if n := counter(t, f.node, "troupe_capacity_waits_unwritten", ""); n != 0 {
		t.Fatalf("unwritten waits %v after the job ran, want 0", n)
	}
}

// TestCapacityAWaitLongerThanTheRedeliveryWaitKeepsItsSubmit: JetStream
// offers an un-acked submit again after bus.RedeliveryBackoff[0] (5 s); a
// job waiting unwritten for longer has its submit told in progress, so it
// is not offered again (to this node or a replica) while it waits.
func TestCapacityAWaitLongerThanTheRedeliveryWaitKeepsItsSubmit(t *testing.T) {
	t.Parallel()
	f, g, w := oneJobWaiting(t, "long-1", "long-2")
	// Touched after TouchFirst (2 s), then every TouchEvery (4 s): by the
	// third touch the wait is 10 s old, past the first redelivery wait
	// (5 s) and the second (10 s).
	untilCounter(t, f.node, "troupe_submit_progress_touches_total", 3)
	ctx := context.Background()
	cons, err := f.js.Consumer(ctx, bus.StreamName(f.env.StreamPrefix(), bus.StreamSubmit), bus.ConsumerName(bus.StreamSubmit))
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || info.NumAckPending != 1 {
		t.Fatalf("submit consumer: %d redelivered, %d pending; want 0 and 1 (long-2's submit, held)",
			info.NumRedelivered, info.NumAckPending)
	}
	if n := counter(t, f.node, "troupe_duplicates_absorbed_total", "submit"); n != 0 {
		t.Fatalf("%v duplicate submits absorbed", n)
	}
	g.open("long-1", true)
	if got := w.waitGot(5 * time.Second); got != "long-2" {
		t.Fatalf("got %s, want long-2", got)
	}
	g.open("long-2", true)
	f.succeededWithNoWaitWritten("long-2")
}

// TestCapacityAnUnwrittenWaitIsFoundFromAnyReplica: a job waiting within
// its grace has no record; a replica that does not hold it finds it on
// the one that does (Node.WaitingJob), with its reason and position, and
// lists it (Node.WaitingJobs).
func TestCapacityAnUnwrittenWaitIsFoundFromAnyReplica(t *testing.T) {
	t.Parallel()
	f := newFixture(t, noBackoff)
	a := f.node
	b := newNodeOn(t, f, "node-b", noBackoff)
	f.node = a
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "single", 1, time.Hour, g.wait)
	f.waitWorkers(1)
	first := "rep-1"
	f.submit(echoReq(first))
	w.waitGot(5 * time.Second)
	f.submit(echoReq("rep-2"))
	f.submit(echoReq("rep-3"))
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	found := map[string]string{}
	for len(found) < 2 {
		for _, id := range []string{"rep-2", "rep-3"} {
			for _, n := range []*troupe.Node{a, b} {
				if wj, err := n.WaitingJob(ctx, id); err == nil && wj != nil {
					if wj.Reason != jobstate.ReasonPoolOverloaded || wj.Topic != "job.echo" {
						t.Fatalf("%s waiting = %+v", id, wj)
					}
					if prev, ok := found[id]; ok && prev != wj.Node {
						t.Fatalf("%s found waiting on %s and %s", id, prev, wj.Node)
					}
					found[id] = wj.Node
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("found waiting: %v; want rep-2 and rep-3 from both nodes", found)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Each is found from both nodes.
	for _, id := range []string{"rep-2", "rep-3"} {
		for _, n := range []*troupe.Node{a, b} {
			if wj, err := n.WaitingJob(ctx, id); err != nil || wj == nil || wj.Node != found[id] {
				t.Fatalf("%s from %s: %+v, %v; want it on %s", id, n.ID(), wj, err, found[id])
			}
		}
	}
	if wj, err := a.WaitingJob(ctx, "rep-none"); err != nil || wj != nil {
		t.Fatalf("a job nobody holds: %+v, %v", wj, err)
	}
	// Each node lists both (its own and the other's), newest first.
	for _, n := range []*troupe.Node{a, b} {
		ws, err := n.WaitingJobs(ctx, "", 10)
		if err != nil || len(ws) != 2 || ws[0].Since.Before(ws[1].Since) {
			t.Fatalf("%s lists %+v, %v; want rep-2 and rep-3, newest first", n.ID(), ws, err)
		}
		for _, w := range ws {
			if w.Node != found[w.JobID] {
				t.Fatalf("%s lists %s on %s, want %s", n.ID(), w.JobID, w.Node, found[w.JobID])
			}
		}
	}
	g.open(first, true)
	for range 2 {
		g.open(w.waitGot(10*time.Second), true)
	}
	f.waitState("rep-2", jobstate.StateSucceeded)
	f.waitState("rep-3", jobstate.StateSucceeded)
}
