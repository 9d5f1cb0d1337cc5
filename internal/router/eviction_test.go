package router

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/proto/capv1"
)

// fakeClock is a router clock the test moves.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock(t0 time.Time) *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t0.UnixNano())
	return c
}

func (c *fakeClock) now() time.Time  { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) set(t time.Time) { c.ns.Store(t.UnixNano()) }
func (b *routerBundle) sweepAt(t *testing.T, c *fakeClock, at time.Time) {
	t.Helper()
	c.set(at)
	b.sys.Root.Send(b.pid, sweepTick{})
	b.workers(t) // the sweep has run
}

// beatEvery announces a heartbeat interval, so the worker's window is
// known from its first beat.
func beatEvery(id string, every time.Duration) *capv1.Heartbeat {
	return &capv1.Heartbeat{WorkerId: id, Pool: "a",
		Labels: map[string]string{registry.LabelHeartbeatInterval: every.String()}}
}

type lostJobs struct {
	worker string
	jobs   []string
	at     time.Time
}

// TestRouterAdoptedJobOfAnEvictedWorkerIsLostAtOnce: a job adopted (or
// re-activated) for a worker this router has already evicted is reported
// lost with that worker at once, carrying the eviction's time, so its
// worker-lost grace runs from the eviction; a job whose worker itself just
// spoke (Heard) is not; a worker that heartbeats again is no longer
// counted evicted.
func TestRouterAdoptedJobOfAnEvictedWorkerIsLostAtOnce(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	clock := newFakeClock(t0)
	lost := make(chan lostJobs, 8)
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 30 * time.Second,
		SweepEach: time.Second, Now: clock.now,
		OnEvictJobs: func(w string, ids []string, at time.Time) { lost <- lostJobs{w, ids, at} }})
	b.beat(beatEvery("w1", time.Second), t0) // window 3.5 s
	b.beat(beatEvery("w2", time.Second), t0)
	for s := 1; s <= 5; s++ { // w2 keeps beating, w1 went silent at t0
		at := t0.Add(time.Duration(s) * time.Second)
		b.beat(beatEvery("w2", time.Second), at)
		b.sweepAt(t, clock, at)
	}
	evictedAt := t0.Add(4 * time.Second)
	if ws := b.workers(t); len(ws) != 1 || ws[0].ID != "w2" {
		t.Fatalf("workers = %+v, want w1 evicted", ws)
	}
	clock.set(t0.Add(45 * time.Second)) // A's jobs are adopted well after the eviction
	b.sys.Root.Send(b.pid, &Occupied{WorkerID: "w1", JobID: "adopted", Started: true})
	b.sys.Root.Send(b.pid, &Occupied{WorkerID: "w1", JobID: "spoke", Started: true, Heard: true})
	b.workers(t)
	select {
	case l := <-lost:
		if l.worker != "w1" || len(l.jobs) != 1 || l.jobs[0] != "adopted" || !l.at.Equal(evictedAt) {
			t.Fatalf("lost %+v, want job adopted on w1 as of %v", l, evictedAt)
		}
	default:
		t.Fatal("a job adopted for an evicted worker was not reported lost")
	}
	select {
	case l := <-lost:
		t.Fatalf("lost %+v: the worker spoke for that job", l)
	default:
	}
	b.beat(beatEvery("w1", time.Second), t0.Add(46*time.Second)) // w1 is back
	b.sys.Root.Send(b.pid, &Occupied{WorkerID: "w1", JobID: "later", Started: true})
	b.workers(t)
	select {
	case l := <-lost:
		t.Fatalf("lost %+v for a worker heartbeating again", l)
	default:
	}
	for _, w := range b.workers(t) {
		if w.ID == "w1" && w.Dispatched != 1 {
			t.Fatalf("w1 counts %d jobs, want the adopted one", w.Dispatched)
		}
	}
}

// TestRouterEveryWorkerSilentAtOnceEvictsNobody: when every worker goes
// silent at once (the bus stalled), no sweep evicts any of them, however
// short a window; after the first heartbeat a worker still silent since
// the stall is kept StallReconnect after it (it may be reconnecting), then
// evicted.
func TestRouterEveryWorkerSilentAtOnceEvictsNobody(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	clock := newFakeClock(t0)
	evicted := make(chan string, 8)
	var up atomic.Bool
	up.Store(true) // this node's link stays up: a server that froze, unnoticed
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 30 * time.Second,
		SweepEach: time.Second, Now: clock.now, OnEvict: func(id string) { evicted <- id },
		Link: func() (bool, uint64) { return up.Load(), 0 }})
	b.beat(beatEvery("fast", 500*time.Millisecond), t0) // window 2 s
	b.beat(beatEvery("slow", 5*time.Second), t0)        // window 17.5 s
	for s := 1; s <= 90; s++ {                          // 90 s of silence from everyone, a sweep a second
		b.sweepAt(t, clock, t0.Add(time.Duration(s)*time.Second))
	}
	select {
	case id := <-evicted:
		t.Fatalf("%s evicted while every worker was silent", id)
	default:
	}
	resumed := t0.Add(91 * time.Second)
	b.beat(beatEvery("slow", 5*time.Second), resumed) // the bus flows again; fast stays silent
	b.sweepAt(t, clock, resumed.Add(time.Second))
	select {
	case id := <-evicted:
		t.Fatalf("%s evicted within its window after heartbeats resumed", id)
	default:
	}
	b.sweepAt(t, clock, resumed.Add(3*time.Second)) // fast silent a whole window since
	select {
	case id := <-evicted:
		t.Fatalf("%s evicted within StallReconnect of the stall", id)
	default:
	}
	b.sweepAt(t, clock, t0.Add(90*time.Second+StallReconnect)) // the last hushed sweep + StallReconnect
	select {
	case id := <-evicted:
		if id != "fast" {
			t.Fatalf("evicted %s, want fast", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("fast never evicted after a window of silence while slow spoke")
	}
}

// TestRouterWorkerSilentSinceTheLinkDroppedIsKeptWhileReconnecting: this
// node's NATS link drops and comes back; w1 speaks again at once, w2 (its
// reconnect wait longer than its window) does not. w2 is kept — stale, so
// nothing new is placed on it, and its jobs are not reported lost — until
// StallReconnect after the last sweep that saw the stall, then evicted
// with its jobs. A worker heard after the stall (w3) is evicted by its
// window as usual. (The NATS kill -9 fault run in which w2, evicted 150 ms
// before it reconnected, had its unannounced jobs placed on w1 too.)
func TestRouterWorkerSilentSinceTheLinkDroppedIsKeptWhileReconnecting(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	clock := newFakeClock(t0)
	evicted := make(chan string, 8)
	lost := make(chan lostJobs, 8)
	var up atomic.Bool
	var reconnects atomic.Uint64
	up.Store(true)
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 30 * time.Second,
		SweepEach: time.Second, Now: clock.now, OnEvict: func(id string) { evicted <- id },
		OnEvictJobs: func(w string, ids []string, at time.Time) { lost <- lostJobs{w, ids, at} },
		Link:        func() (bool, uint64) { return up.Load(), reconnects.Load() }})
	for _, id := range []string{"w1", "w2"} {
		b.beat(beatEvery(id, 500*time.Millisecond), t0) // window 2 s
	}
	b.sweepAt(t, clock, t0.Add(100*time.Millisecond))
	b.sys.Root.Send(b.pid, &Occupied{WorkerID: "w2", JobID: "on-w2", Heard: true})
	up.Store(false) // the server is killed
	b.sweepAt(t, clock, t0.Add(time.Second))
	up.Store(true)
	reconnects.Store(1)
	stalled := t0.Add(2 * time.Second) // the last sweep that saw the stall
	b.sweepAt(t, clock, stalled)
	b.beat(beatEvery("w3", 500*time.Millisecond), stalled.Add(500*time.Millisecond)) // heard after the stall, then silent
	for at := stalled.Add(500 * time.Millisecond); at.Before(stalled.Add(StallReconnect)); at = at.Add(500 * time.Millisecond) {
		b.beat(beatEvery("w1", 500*time.Millisecond), at)
		if at.Sub(stalled)%time.Second == 0 {
			b.sweepAt(t, clock, at)
		}
	}
	select {
	case id := <-evicted:
		if id != "w3" {
			t.Fatalf("evicted %s, want w3 alone within StallReconnect of the stall", id)
		}
	default:
		t.Fatal("w3, heard after the stall and silent since, was not evicted by its window")
	}
	select {
	case id := <-evicted:
		t.Fatalf("%s evicted within StallReconnect of the stall, silent since it", id)
	case l := <-lost:
		t.Fatalf("jobs %v of %s reported lost within StallReconnect of the stall", l.jobs, l.worker)
	default:
	}
	if p := b.pick(t, "job.a"); p.WorkerID != "w1" {
		t.Fatalf("picked %+v, want w1: w2, kept while reconnecting, is stale (nothing new placed on it)", p)
	}
	b.sweepAt(t, clock, stalled.Add(StallReconnect))
	select {
	case id := <-evicted:
		if id != "w2" {
			t.Fatalf("evicted %s, want w2 at StallReconnect after the stall", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("w2 never evicted StallReconnect after the stall")
	}
	select {
	case l := <-lost:
		if l.worker != "w2" || len(l.jobs) != 1 || l.jobs[0] != "on-w2" {
			t.Fatalf("lost %+v, want on-w2 of w2", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("w2's job not reported lost at its eviction")
	}
}

// TestRouterEvictsASilentWorkerWhileAnotherSpeaks: a worker that goes
// silent while another keeps beating is evicted at the end of its window,
// whatever the other's interval; and workers silent past HushMax are
// taken to be gone.
func TestRouterEvictsASilentWorkerWhileAnotherSpeaks(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	clock := newFakeClock(t0)
	evicted := make(chan string, 8)
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 30 * time.Second,
		SweepEach: time.Second, Now: clock.now, OnEvict: func(id string) { evicted <- id }})
	b.beat(beatEvery("dead", 500*time.Millisecond), t0)
	b.beat(beatEvery("alive", 500*time.Millisecond), t0)
	b.beat(beatEvery("alive", 500*time.Millisecond), t0.Add(time.Second))
	b.beat(beatEvery("alive", 500*time.Millisecond), t0.Add(2*time.Second))
	b.sweepAt(t, clock, t0.Add(2100*time.Millisecond)) // dead's window (2 s) is over
	select {
	case id := <-evicted:
		if id != "dead" {
			t.Fatalf("evicted %s, want dead", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a silent worker was not evicted while another spoke")
	}
	// Now alive dies too, and a third worker with it: all silent at once.
	b.beat(beatEvery("third", 500*time.Millisecond), t0.Add(2*time.Second))
	for _, d := range []time.Duration{5 * time.Second, HushMax} {
		b.sweepAt(t, clock, t0.Add(d))
	}
	select {
	case id := <-evicted:
		t.Fatalf("%s evicted when the hush began", id)
	default:
	}
	b.sweepAt(t, clock, t0.Add(5*time.Second+HushMax))
	awaitEvictions(t, evicted, 2, "evicted %v after HushMax of silence, want alive and third")
}

// TestRouterBeatsCarryTheLastHeartbeatHeard: Beats gives, for dispatches
// to carry, the send time of a worker's latest heartbeat and its window;
// an eviction clears it.
func TestRouterBeatsCarryTheLastHeartbeatHeard(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	clock := newFakeClock(t0)
	beats := NewBeats()
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 30 * time.Second,
		SweepEach: time.Second, Now: clock.now, Beats: beats})
	sent := t0.Add(-time.Millisecond)
	b.sys.Root.Send(b.pid, &HeartbeatSeen{HB: beatEvery("w1", time.Second), At: t0, Sent: sent})
	b.sys.Root.Send(b.pid, &HeartbeatSeen{HB: beatEvery("w1", time.Second), At: t0, Sent: sent.Add(-time.Second)}) // late, older
	b.workers(t)
	heard, window, ok := beats.Stamp("w1")
	if !ok || !heard.Equal(sent) || window != 3500*time.Millisecond {
		t.Fatalf("stamp = %v %v %v, want %v 3.5s", heard, window, ok, sent)
	}
	b.sweepAt(t, clock, t0.Add(10*time.Second))
	if _, _, ok := beats.Stamp("w1"); ok {
		t.Fatal("an evicted worker still has a stamp")
	}
}

// TestRouterSilentWorkersAreEvictedWhileTheBusCarriesTraffic: every worker
// silent at once, but this node's connection still receives messages
// (Config.Heard): the bus works, so the workers' silence is their own and
// each is evicted at the end of its window; once the traffic stops too,
// the next worker to fall silent is held.
func TestRouterSilentWorkersAreEvictedWhileTheBusCarriesTraffic(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	clock := newFakeClock(t0)
	evicted := make(chan string, 8)
	var msgs atomic.Uint64
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 30 * time.Second,
		SweepEach: time.Second, Now: clock.now, OnEvict: func(id string) { evicted <- id },
		Heard: func() uint64 { return msgs.Add(1) }}) // a message between any two sweeps
	b.beat(beatEvery("w1", 500*time.Millisecond), t0)
	b.beat(beatEvery("w2", 500*time.Millisecond), t0)
	for s := 1; s <= 3; s++ {
		b.sweepAt(t, clock, t0.Add(time.Duration(s)*time.Second))
	}
	awaitEvictions(t, evicted, 2, "evicted %v, want w1 and w2: the bus carried traffic while they were silent")
}

// TestRouterWorkersSilentSinceAHushAreKeptWhenOnlyTheBusResumes: every
// worker falls silent with the bus (the hush); then this node's
// connection carries messages again (Config.Heard) but no heartbeat yet.
// The workers' silence since the stall may be their reconnect: they are
// kept StallReconnect after the last hushed sweep, then evicted.
func TestRouterWorkersSilentSinceAHushAreKeptWhenOnlyTheBusResumes(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	clock := newFakeClock(t0)
	evicted := make(chan string, 8)
	var msgs atomic.Uint64
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 30 * time.Second,
		SweepEach: time.Second, Now: clock.now, OnEvict: func(id string) { evicted <- id },
		Heard: func() uint64 { return msgs.Load() }})
	b.beat(beatEvery("w1", 500*time.Millisecond), t0) // window 2 s
	b.beat(beatEvery("w2", 500*time.Millisecond), t0)
	for s := 1; s <= 5; s++ { // the hush: nothing reaches this node
		b.sweepAt(t, clock, t0.Add(time.Duration(s)*time.Second))
	}
	hushed := t0.Add(5 * time.Second)
	for s := 6; s < 5+int(StallReconnect/time.Second); s++ { // messages again, no heartbeat
		msgs.Add(1)
		b.sweepAt(t, clock, t0.Add(time.Duration(s)*time.Second))
	}
	select {
	case id := <-evicted:
		t.Fatalf("%s evicted within StallReconnect of the hush", id)
	default:
	}
	msgs.Add(1)
	b.sweepAt(t, clock, hushed.Add(StallReconnect))
	awaitEvictions(t, evicted, 2, "evicted %v, want w1 and w2 StallReconnect after the hush")
}

// TestEvictedMemoryIsBounded: evicted workers are remembered up to
// EvictedMemoryMax and EvictedMemory; a worker that came back and was
// evicted again keeps its later time.
func TestEvictedMemoryIsBounded(t *testing.T) {
	t.Parallel()
	var e evictedMemory
	t0 := time.Now()
	e.add("w", t0)
	e.forget("w")
	e.add("w", t0.Add(time.Minute))
	e.expire(t0.Add(time.Second)) // the first eviction's entry goes, not the second's
	if at, ok := e.when("w"); !ok || !at.Equal(t0.Add(time.Minute)) {
		t.Fatalf("w: %v %v, want its later eviction", at, ok)
	}
	for i := range EvictedMemoryMax + 10 {
		e.add("x"+strconv.Itoa(i), t0.Add(2*time.Minute))
	}
	if len(e.at) != EvictedMemoryMax || len(e.order) > 2*EvictedMemoryMax {
		t.Fatalf("%d remembered, %d in order; want %d at most", len(e.at), len(e.order), EvictedMemoryMax)
	}
	e.expire(t0.Add(2*time.Minute + EvictedMemory))
	if len(e.at) != 0 || len(e.order) != 0 {
		t.Fatalf("%d remembered an hour on", len(e.at))
	}
}

// awaitEvictions waits (5 s at most for each) until n distinct workers were
// evicted; failf formats the failure with the set evicted so far.
func awaitEvictions(t *testing.T, evicted <-chan string, n int, failf string) {
	t.Helper()
	got := map[string]bool{}
	for len(got) < n {
		select {
		case id := <-evicted:
			got[id] = true
		case <-time.After(5 * time.Second):
			t.Fatalf(failf, got)
		}
	}
}
