package registry

import (
	"math/rand/v2"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func beat(id, pool string) *capv1.Heartbeat {
	return &capv1.Heartbeat{WorkerId: id, Pool: pool}
}

// checkIndex asserts the heap invariant and the position bookkeeping of x.
func checkIndex(t *testing.T, x *index) {
	t.Helper()
	for i := range x.heap {
		if got := x.pos[x.heap[i].id]; int(got) != i {
			t.Fatalf("slot %d: pos says %d", i, got)
		}
		w := x.byID[x.heap[i].id]
		if w.score != x.heap[i].score || w.tie != x.heap[i].tie {
			t.Fatalf("slot %d: key %v/%v, worker %s has %v/%v", i, x.heap[i].score, x.heap[i].tie, w.ID, w.score, w.tie)
		}
		if i > 0 && x.heap[i].before(&x.heap[(i-1)/2]) {
			t.Fatalf("slot %d is before its parent", i)
		}
	}
}

func TestRegistryLivenessUsesTTL(t *testing.T) {
	t.Parallel()
	r := New(0)
	if r.TTL() != TTLDefault {
		t.Fatalf("default TTL = %v, want %v", r.TTL(), TTLDefault)
	}
	w := r.Observe(beat("w1", "p"), t0)
	if !r.Live(w, t0.Add(TTLDefault-time.Millisecond)) {
		t.Fatal("worker not live just inside the TTL")
	}
	if r.Live(w, t0.Add(TTLDefault)) {
		t.Fatal("worker still live at the TTL")
	}

	short := New(5 * time.Second)
	w = short.Observe(beat("w1", "p"), t0)
	if short.Live(w, t0.Add(5*time.Second)) {
		t.Fatal("configured TTL ignored")
	}
}

func TestRegistryLearnsIntervalAndAllowsThreeMissedBeats(t *testing.T) {
	t.Parallel()
	r := New(TTLDefault)
	var w *Worker
	for i := range 3 { // two gaps of 2 s
		w = r.Observe(beat("w1", "p"), t0.Add(time.Duration(i)*2*time.Second))
	}
	last := t0.Add(4 * time.Second)
	if w.Interval != 2*time.Second {
		t.Fatalf("learned interval = %v, want 2s", w.Interval)
	}
	// Three missed beats plus half an interval of slack: 7 s.
	if !r.Live(w, last.Add(7*time.Second-time.Millisecond)) {
		t.Fatal("stale before three intervals were missed")
	}
	if r.Live(w, last.Add(7*time.Second)) {
		t.Fatal("still live after three missed intervals (TTL 30 s should not apply)")
	}
}

func TestRegistryLearnedIntervalIgnoresOneEarlyBeat(t *testing.T) {
	t.Parallel()
	r := New(TTLDefault)
	at := t0
	for range 3 {
		r.Observe(beat("w1", "p"), at)
		at = at.Add(5 * time.Second)
	}
	// An extra beat 50 ms after a regular one (a worker reporting a state
	// change) must not shrink the liveness window.
	r.Observe(beat("w1", "p"), at)
	w := r.Observe(beat("w1", "p"), at.Add(50*time.Millisecond))
	if w.Interval != 5*time.Second {
		t.Fatalf("interval = %v after an early beat, want 5s", w.Interval)
	}
}

func TestRegistryAnnouncedIntervalWins(t *testing.T) {
	t.Parallel()
	r := New(TTLDefault)
	hb := beat("w1", "p")
	hb.Labels = map[string]string{LabelHeartbeatInterval: "1s"}
	w := r.Observe(hb, t0)
	if w.Interval != time.Second {
		t.Fatalf("interval = %v, want the announced 1s", w.Interval)
	}
	if !r.Live(w, t0.Add(3500*time.Millisecond-time.Millisecond)) || r.Live(w, t0.Add(3500*time.Millisecond)) {
		t.Fatal("a 1 s announced interval should give a 3.5 s window")
	}
	// 500 ms would give 1.75 s, under the floor that keeps a fast beater
	// from flapping.
	hb.Labels = map[string]string{LabelHeartbeatInterval: "500ms"}
	w = r.Observe(hb, t0)
	if !r.Live(w, t0.Add(LearnedTTLFloor-time.Millisecond)) || r.Live(w, t0.Add(LearnedTTLFloor)) {
		t.Fatalf("a 500 ms announced interval should give the %v floor", LearnedTTLFloor)
	}
}

func TestRegistrySweepEvictsAndCountsLivePerPool(t *testing.T) {
	t.Parallel()
	r := New(10 * time.Second)
	r.Observe(beat("a1", "a"), t0)
	r.Observe(beat("a2", "a"), t0.Add(8*time.Second))
	r.Observe(beat("b1", "b"), t0.Add(8*time.Second))
	now := t0.Add(10 * time.Second)
	if got := r.LivePerPool(now); got["a"] != 1 || got["b"] != 1 {
		t.Fatalf("live per pool = %v, want a:1 b:1", got)
	}
	gone := r.Sweep(now)
	if len(gone) != 1 || gone[0].ID != "a1" {
		t.Fatalf("swept %v, want a1", gone)
	}
	if r.Get("a1") != nil || r.Len() != 2 || len(r.Pool("a")) != 1 {
		t.Fatal("evicted worker still indexed")
	}
	r.Sweep(now.Add(time.Hour))
	if r.Len() != 0 || len(r.Pools()) != 0 {
		t.Fatalf("registry not empty after everything expired: %d workers, pools %v", r.Len(), r.Pools())
	}
}

func TestRegistryTopIsLeastLoadedAndDispatchReorders(t *testing.T) {
	t.Parallel()
	r := New(time.Minute)
	for i, load := range []int32{3, 1, 2} {
		hb := beat("w"+strconv.Itoa(i), "p")
		hb.ActiveJobs = load
		r.Observe(hb, t0)
	}
	if top := r.Top("p"); top.ID != "w1" {
		t.Fatalf("top = %s, want w1 (1 active)", top.ID)
	}
	r.CountDispatch(r.Get("w1"))
	r.CountDispatch(r.Get("w1")) // w1 now 3
	if top := r.Top("p"); top.ID != "w2" {
		t.Fatalf("top after two dispatches to w1 = %s, want w2", top.ID)
	}
	// A heartbeat does not forget what was sent since the last one: w1's
	// two dispatches still count (active 0 + 2), until they are done.
	hb := beat("w1", "p")
	hb.ActiveJobs = 0
	r.Observe(hb, t0.Add(time.Second))
	if n := r.Get("w1").InFlight(); n != 2 {
		t.Fatalf("w1 in flight after its heartbeat = %d, want 2 (its two dispatches)", n)
	}
	r.CountDone(r.Get("w1"))
	r.CountDone(r.Get("w1"))
	if top := r.Top("p"); top.ID != "w1" || top.InFlight() != 0 {
		t.Fatalf("top after w1's jobs ended = %s (in flight %d), want w1 with 0", top.ID, top.InFlight())
	}
	checkIndex(t, &r.pools["p"].index)
}

func TestRegistryOverloadedWorkersLeaveTheHeap(t *testing.T) {
	t.Parallel()
	r := New(time.Minute)
	hb := beat("busy", "p")
	hb.ActiveJobs, hb.MaxParallelJobs = 9, 10
	r.Observe(hb, t0)
	r.SetThresholds(map[string]Thresholds{"p": {ActiveRatio: 0.9}})
	hot := beat("hot", "p")
	hot.CpuLoad = 90
	r.Observe(hot, t0)
	gpu := beat("gpu", "p")
	gpu.GpuUtilization = 95
	r.Observe(gpu, t0)
	if top := r.Top("p"); top != nil {
		t.Fatalf("top = %s, want none: every worker is overloaded", top.ID)
	}
	if n := r.OverloadedCount("p"); n != 3 {
		t.Fatalf("overloaded = %d, want 3", n)
	}
	// A laxer pool threshold brings them back.
	r.SetThresholds(map[string]Thresholds{"p": {ActiveRatio: 1, CPULoad: 99, GPUUtil: 99}})
	if n := r.OverloadedCount("p"); n != 0 || r.Top("p") == nil {
		t.Fatalf("overloaded = %d under lax thresholds, want 0", n)
	}
	// Dispatches count towards max_parallel: busy (9/10) takes one more, then
	// is overloaded at 10/10.
	busy := r.Get("busy")
	r.CountDispatch(busy)
	if !r.Overloaded(busy) || r.OverloadedCount("p") != 1 {
		t.Fatal("dispatch to a full worker did not mark it overloaded")
	}
}

func TestRegistryMarkStaleUntilNextHeartbeat(t *testing.T) {
	t.Parallel()
	r := New(time.Minute)
	w := r.Observe(beat("w1", "p"), t0)
	r.MarkStale(w)
	if r.Top("p") != nil || r.StaleCount("p") != 1 {
		t.Fatal("stale worker still placeable")
	}
	r.Observe(beat("w1", "p"), t0.Add(time.Second))
	if r.Top("p") != w || r.StaleCount("p") != 0 {
		t.Fatal("heartbeat did not bring the stale worker back")
	}
}

func TestRegistryPoolChangeMovesWorker(t *testing.T) {
	t.Parallel()
	r := New(time.Minute)
	r.Observe(beat("w1", "a"), t0)
	r.Observe(beat("w1", "b"), t0.Add(time.Second))
	if r.Top("a") != nil || len(r.Pool("a")) != 0 {
		t.Fatal("worker still in its old pool")
	}
	if top := r.Top("b"); top == nil || top.ID != "w1" {
		t.Fatal("worker not in its new pool")
	}
}

func TestRegistrySelectorTracksLabelledWorkers(t *testing.T) {
	t.Parallel()
	r := New(time.Minute)
	keep := func(string) bool { return true }
	for i := range 6 {
		hb := beat("w"+strconv.Itoa(i), "p")
		hb.ActiveJobs = int32(i)
		if i%2 == 1 {
			hb.Labels = map[string]string{"zone": "a"}
		}
		r.Observe(hb, t0)
	}
	job := map[string]string{"zone": "a"}
	sel := r.Select("p", job, keep, t0)
	if top := sel.Top(); top == nil || top.ID != "w1" {
		t.Fatalf("selector top = %v, want w1", top)
	}
	// Same label set, another map: the same index.
	if again := r.Select("p", map[string]string{"zone": "a"}, keep, t0); again.s != sel.s {
		t.Fatal("selector rebuilt for an equal label set")
	}
	// A worker gaining the label joins; one losing it leaves.
	hb := beat("w0", "p")
	hb.Labels = map[string]string{"zone": "a"}
	r.Observe(hb, t0)
	r.Observe(beat("w1", "p"), t0)
	if top := sel.Top(); top == nil || top.ID != "w0" {
		t.Fatalf("selector top after relabel = %v, want w0", top)
	}
	r.CountDispatch(r.Get("w0"))
	r.CountDispatch(r.Get("w0"))
	r.CountDispatch(r.Get("w0")) // w0 at 3 = w3 at 3, both zone=a; w5 at 5
	if top := sel.Top(); top.ID != "w0" && top.ID != "w3" {
		t.Fatalf("selector top after dispatches = %s", top.ID)
	}
	checkIndex(t, &sel.s.index)
	// Unused selectors go at the sweep.
	r.Sweep(t0.Add(SelectorIdle + time.Second))
	if p := r.pools["p"]; p != nil && p.nSelectors != 0 {
		t.Fatal("idle selector kept")
	}
}

// TestRegistryIndexesStayConsistent drives random heartbeats, dispatches,
// stale marks, relabels, pool moves and sweeps, and checks every index
// against a brute-force view after each step.
func TestRegistryIndexesStayConsistent(t *testing.T) {
	t.Parallel()
	rnd := rand.New(rand.NewPCG(1, 2))
	r := New(10 * time.Second)
	keep := func(string) bool { return true }
	pools := []string{"a", "b"}
	zones := []string{"x", "y"}
	now := t0
	for step := range 5000 {
		now = now.Add(time.Duration(rnd.IntN(200)) * time.Millisecond)
		id := "w" + strconv.Itoa(rnd.IntN(40))
		switch op := rnd.IntN(10); {
		case op < 5:
			hb := beat(id, pools[rnd.IntN(2)])
			hb.ActiveJobs, hb.MaxParallelJobs = int32(rnd.IntN(5)), int32(rnd.IntN(8))
			hb.CpuLoad = float32(rnd.IntN(100))
			hb.Labels = map[string]string{"zone": zones[rnd.IntN(2)]}
			if rnd.IntN(3) == 0 {
				hb.Labels[LabelDispatch] = DispatchDirect
			}
			r.Observe(hb, now)
		case op < 8:
			w := r.Get(id)
			switch job := "j" + strconv.Itoa(rnd.IntN(60)); {
			case w == nil:
			case op == 5:
				r.CountDispatch(w)
			case op == 6:
				r.Occupy(w, job)
			default:
				r.Vacate(w, job)
			}
		case op < 9:
			if w := r.Get(id); w != nil {
				r.MarkStale(w)
			}
		default:
			r.Select(pools[rnd.IntN(2)], map[string]string{"zone": zones[rnd.IntN(2)]}, keep, now)
			if rnd.IntN(4) == 0 {
				r.Sweep(now)
			}
		}
		for _, name := range pools {
			p := r.pools[name]
			if p == nil {
				continue
			}
			checkIndex(t, &p.index)
			heap, over, stale := 0, 0, 0
			for _, w := range p.members {
				switch w.placed {
				case placedHeap:
					heap++
				case placedOverloaded:
					over++
				case placedStale:
					stale++
				}
				if (w.placed == placedOverloaded) != (w.placed != placedStale && r.Overloaded(w)) {
					t.Fatalf("step %d: %s placed %d, overloaded %v", step, w.ID, w.placed, r.Overloaded(w))
				}
			}
			if heap != len(p.heap) || over != p.overloaded || stale != p.stale {
				t.Fatalf("step %d: pool %s counts heap %d/%d over %d/%d stale %d/%d", step, name,
					heap, len(p.heap), over, p.overloaded, stale, p.stale)
			}
			checkPoolCounts(t, step, p)
			for _, ss := range p.selectors {
				for _, s := range ss {
					checkIndex(t, &s.index)
					var want, got []string
					for _, w := range p.members {
						if w.HasLabels(s.pairs) && w.placed == placedHeap {
							want = append(want, w.ID)
						}
					}
					for _, sl := range s.heap {
						got = append(got, s.byID[sl.id].ID)
					}
					sort.Strings(want)
					sort.Strings(got)
					if len(want) != len(got) {
						t.Fatalf("step %d: selector %v holds %v, want %v", step, s.pairs, got, want)
					}
					for i := range want {
						if want[i] != got[i] {
							t.Fatalf("step %d: selector %v holds %v, want %v", step, s.pairs, got, want)
						}
					}
				}
			}
		}
	}
}

// TestRegistryLearnsIntervalsFromSendTimes: heartbeats that queued while
// the node was paused arrive a millisecond apart; learned from their send
// times, the interval stays the worker's 5 s, and its liveness window stays
// above it.
func TestRegistryLearnsIntervalsFromSendTimes(t *testing.T) {
	t.Parallel()
	r := New(time.Minute)
	sent := t0
	for i := 0; i < 3; i++ { // regular beats, 5 s apart
		r.ObserveSent(beat("w1", "p"), sent, sent)
		sent = sent.Add(5 * time.Second)
	}
	arrive := sent.Add(40 * time.Second) // paused 40 s: eight beats queued
	for i := 0; i < 8; i++ {
		r.ObserveSent(beat("w1", "p"), arrive.Add(time.Duration(i)*time.Millisecond), sent)
		sent = sent.Add(5 * time.Second)
	}
	w := r.Get("w1")
	if w.Interval != 5*time.Second {
		t.Fatalf("interval = %v, want 5s", w.Interval)
	}
	if ttl := w.Deadline().Sub(w.LastSeen); ttl <= 5*time.Second {
		t.Fatalf("liveness window %v is not above the 5 s interval", ttl)
	}
	// Without send times the burst teaches a millisecond (what the send
	// times are for).
	r2 := New(time.Minute)
	for i := 0; i < 8; i++ {
		r2.Observe(beat("w1", "p"), arrive.Add(time.Duration(i)*time.Millisecond))
	}
	if got := r2.Get("w1").Interval; got > 10*time.Millisecond {
		t.Fatalf("arrival-learned interval = %v; the test no longer shows the burst", got)
	}
}

// TestRegistryLingeringJobs: a job that ended without its worker's answer
// keeps its slot until the worker's heartbeats stop counting it, and is
// forgotten after LingerFor.
func TestRegistryLingeringJobs(t *testing.T) {
	t.Parallel()
	r := New(time.Hour)
	hb := beat("w1", "p")
	hb.MaxParallelJobs, hb.ActiveJobs = 1, 1
	w := r.Observe(hb, t0.Add(-2*time.Second)) // reports active_jobs: its counts reconcile
	hb.ActiveJobs = 0
	r.Observe(hb, t0.Add(-time.Second))
	r.Occupy(w, "cancelled")
	r.Linger(w, "cancelled", t0.Add(LingerFor))
	if w.InFlight() != 1 || r.HasRoom(w) {
		t.Fatalf("in flight %d right after the cancel, want 1 (the worker may still run it)", w.InFlight())
	}
	hb.ActiveJobs = 1 // still running it
	r.Observe(hb, t0.Add(time.Second))
	r.Observe(hb, t0.Add(2*time.Second))
	if w.InFlight() != 1 {
		t.Fatalf("in flight %d while the worker reports it, want 1", w.InFlight())
	}
	hb.ActiveJobs = 0 // the worker let it go
	r.Observe(hb, t0.Add(3*time.Second))
	if w.InFlight() != 0 || !r.HasRoom(w) {
		t.Fatalf("in flight %d once the worker reports none, want 0", w.InFlight())
	}
	r.Observe(hb, t0.Add(LingerFor+time.Minute))
	if len(w.jobs) != 0 || w.Dispatched != 0 {
		t.Fatalf("jobs %v dispatched %d after LingerFor, want none", w.jobs, w.Dispatched)
	}
}

// TestRegistryIdleWorkerWithMaxParallelFreesJobsItDoesNotHold: a worker
// that announces max_parallel_jobs and has only ever reported 0 active
// jobs (on a pool subject NATS gave the jobs counted on it to another
// member, which lost them) frees them once its heartbeats have had a whole
// interval to count them — not at their running deadline (issue 27, item 8).
func TestRegistryIdleWorkerWithMaxParallelFreesJobsItDoesNotHold(t *testing.T) {
	t.Parallel()
	r := New(time.Hour)
	hb := beat("idle", "p")
	hb.MaxParallelJobs, hb.ActiveJobs = 1, 0
	w := r.Observe(hb, t0)
	r.Occupy(w, "lost-elsewhere")
	r.Start(w, "lost-elsewhere", t0)
	if r.HasRoom(w) {
		t.Fatal("room right after the placement")
	}
	r.Observe(hb, t0.Add(time.Second)) // the job may still be on its way
	if r.HasRoom(w) {
		t.Fatal("room one heartbeat after the placement (the job may not have arrived yet)")
	}
	r.Observe(hb, t0.Add(2*time.Second))
	r.Observe(hb, t0.Add(3*time.Second))
	if w.InFlight() != 0 || !r.HasRoom(w) {
		t.Fatalf("in flight %d after heartbeats showing 0 active jobs, want 0", w.InFlight())
	}
}

// TestRegistryPoolSubjectJobRunningOnAnotherMemberKeepsItsSlot: on a pool
// subject NATS, not the router, picks the member. A job counted on X runs
// on Y; X's heartbeats (0 active jobs) must not free its slot while Y has
// not reported since the job could have reached it — nobody would count
// the running job, and the pool would take a third job on its two slots.
// Once every member has reported after the job, the pool's reports (Y's 1)
// keep it counted; a job no member holds (lost) is still freed.
func TestRegistryPoolSubjectJobRunningOnAnotherMemberKeepsItsSlot(t *testing.T) {
	t.Parallel()
	r := New(time.Hour)
	hx, hy := beat("x", "p"), beat("y", "p")
	hx.MaxParallelJobs, hy.MaxParallelJobs = 1, 1
	x := r.Observe(hx, t0)
	y := r.Observe(hy, t0.Add(500*time.Millisecond))
	inFlight := func() int32 { return x.InFlight() + y.InFlight() }
	r.Occupy(x, "j") // NATS hands it to y
	r.Start(x, "j", t0.Add(500*time.Millisecond))
	for i := 1; i <= 4; i++ { // x beats, 0 active; y is late
		r.Observe(hx, t0.Add(time.Duration(i)*time.Second))
		if got := inFlight(); got < 1 {
			t.Fatalf("after x's beat %d (0 active; y silent since before the job): pool in flight %d, want ≥ 1", i, got)
		}
	}
	hy.ActiveJobs = 1 // y runs j
	for i := 5; i <= 9; i++ {
		r.Observe(hy, t0.Add(time.Duration(i)*time.Second+500*time.Millisecond))
		r.Observe(hx, t0.Add(time.Duration(i+1)*time.Second))
		if got := inFlight(); got < 1 || r.Room(x)+r.Room(y) > 1 {
			t.Fatalf("round %d (y reports j): pool in flight %d, room %d+%d; want ≥ 1 and at most one slot free",
				i, got, r.Room(x), r.Room(y))
		}
	}
	r.Vacate(x, "j") // its result
	hy.ActiveJobs = 0
	r.Observe(hy, t0.Add(11*time.Second))
	if got := inFlight(); got != 0 {
		t.Fatalf("pool in flight %d after j's result and y's 0, want 0", got)
	}
	// A job lost (taken, never answered): every member reports 0, so its
	// slot is freed within a few rounds.
	r.Occupy(y, "lost")
	r.Start(y, "lost", t0.Add(11*time.Second))
	for i := 12; i <= 15; i++ {
		r.Observe(hx, t0.Add(time.Duration(i)*time.Second))
		r.Observe(hy, t0.Add(time.Duration(i)*time.Second+500*time.Millisecond))
	}
	if got := inFlight(); got != 0 || !r.HasRoom(x) || !r.HasRoom(y) {
		t.Fatalf("pool in flight %d after four rounds of 0 active jobs, want 0 (the lost job's slot freed)", got)
	}
}

// checkPoolCounts asserts that p's reconciliation sums are its members'.
func checkPoolCounts(t *testing.T, step int, p *poolIndex) {
	t.Helper()
	var c poolCounts
	for _, w := range p.members {
		if w.roundSeen != p.round {
			c.pending++
		}
		c.active += w.ActiveJobs
		if !w.reported {
			c.unreported++
		}
		if w.shared != !w.Direct || w.gone < 0 || w.gone > w.oldOwn || w.oldOwn < 0 {
			t.Fatalf("step %d: %s shared %v direct %v gone %d old %d", step, w.ID, w.shared, w.Direct, w.gone, w.oldOwn)
		}
		if w.shared {
			c.old += w.oldOwn
			c.gone += w.gone
		}
	}
	c.round = p.round
	want := int32(0)
	if c.unreported == 0 {
		want = max(0, c.old-c.active)
	}
	if c.active != p.active || c.old != p.old || c.gone != p.gone || c.unreported != p.unreported ||
		c.gone != want || c.pending != p.pending || p.pending <= 0 {
		t.Fatalf("step %d: pool %s sums %+v, members' %+v (gone should be %d)", step, p.name, p.poolCounts, c, want)
	}
}

// TestRegistryJobAgesFromItsPublishNotItsPick: a job for a worker that
// does not report its start is published only once its dispatch is
// durable. While that write is slow, the pool's members beat with 0 active
// jobs for three rounds; the job must not be old when it is published
// (Start), or those heartbeats free its slot and the pool takes a third job
// on its two slots as it arrives (TestTwoReplicasRecoverTheSlotOfAJobLostOnAStockWorker
// overfilled so under load). Heartbeats after the publish that still show
// 0 (sent before the worker took it) keep it counted; if the worker loses
// it, its slot is still freed a few rounds after the publish.
func TestRegistryJobAgesFromItsPublishNotItsPick(t *testing.T) {
	t.Parallel()
	r := New(time.Hour)
	hx, hy := beat("x", "p"), beat("y", "p")
	hx.MaxParallelJobs, hy.MaxParallelJobs = 1, 1
	x := r.ObserveSent(hx, t0, t0)
	y := r.ObserveSent(hy, t0.Add(500*time.Millisecond), t0.Add(500*time.Millisecond))
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	rounds := func(from, to int) {
		for i := from; i <= to; i++ {
			r.ObserveSent(hx, at(i), at(i)) // sent and read at once
			r.ObserveSent(hy, at(i).Add(500*time.Millisecond), at(i).Add(500*time.Millisecond))
			checkPoolCounts(t, i, x.pool)
		}
	}
	inFlight := func() int32 { return x.InFlight() + y.InFlight() }
	r.Occupy(x, "j") // picked; its dispatch write is slow
	rounds(1, 4)     // 0 active: nobody holds j yet
	if got := inFlight(); got != 1 {
		t.Fatalf("pool in flight %d while j's dispatch is written, want 1", got)
	}
	started := at(4).Add(750 * time.Millisecond)
	r.Start(x, "j", started) // published, started on delivery
	checkPoolCounts(t, 5, x.pool)
	// This node was slow: beats the members sent before j's publish are
	// read after it, in a burst.
	for i := range 6 {
		sent := at(4).Add(time.Duration(100*i) * time.Millisecond)
		r.ObserveSent(hx, started.Add(time.Duration(i)*time.Millisecond), sent)
		r.ObserveSent(hy, started.Add(time.Duration(i)*time.Millisecond), sent)
		checkPoolCounts(t, 5, x.pool)
	}
	if got := inFlight(); got != 1 || r.Room(x)+r.Room(y) > 1 {
		t.Fatalf("pool in flight %d, room %d+%d after beats sent before j's publish; want 1 and one slot free",
			got, r.Room(x), r.Room(y))
	}
	rounds(5, 6) // beats sent before a member took j
	if got := inFlight(); got != 1 || r.Room(x)+r.Room(y) > 1 {
		t.Fatalf("pool in flight %d, room %d+%d two rounds after j's publish (0 active jobs reported); want 1 and one slot free",
			got, r.Room(x), r.Room(y))
	}
	hy.ActiveJobs = 1 // y took j
	rounds(7, 10)
	if got := inFlight(); got < 1 || r.Room(x)+r.Room(y) > 1 {
		t.Fatalf("pool in flight %d, room %d+%d while y runs j; want ≥ 1 and at most one slot free", got, r.Room(x), r.Room(y))
	}
	hy.ActiveJobs = 0 // y lost j (taken, never answered)
	rounds(11, 14)
	if got := inFlight(); got != 0 || !r.HasRoom(x) || !r.HasRoom(y) {
		t.Fatalf("pool in flight %d after four rounds of 0 active jobs, want 0 (the lost job's slot freed)", got)
	}
}
