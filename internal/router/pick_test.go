package router

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// TestUnusedPickIsFreed: a pick its job never dispatches and never gives
// back — the job's actor stopped or restarted before it acted on the reply,
// or dropped the reply as stale — does not stay counted on the worker for
// the worker's lifetime, and the worker's eviction does not report it lost.
// A pick whose job started keeps its slot.
func TestUnusedPickIsFreed(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	t0 := time.Now()
	at := func(d time.Duration) time.Time {
		now := t0.Add(d)
		clock.Store(now.UnixNano())
		return now
	}
	at(0)
	evicted := make(chan string, 1)
	lost := make(chan []string, 1)
	// Sweeps run when the test sends them (SweepEach is far longer than
	// the test's clock moves, so none looks like a pause).
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), TTL: 30 * time.Second,
		SweepEach: 24 * time.Hour, Now: func() time.Time { return time.Unix(0, clock.Load()) },
		OnEvict:     func(id string) { evicted <- id },
		OnEvictJobs: func(_ string, ids []string, _ time.Time) { lost <- ids }})
	hb := &capv1.Heartbeat{WorkerId: "w1", Pool: "a", MaxParallelJobs: 8}
	b.beat(hb, at(0))
	for _, id := range []string{"unused", "started"} {
		r := b.ask(t, &PickRequest{JobID: id, Req: &capv1.JobRequest{JobId: id, Topic: "job.a"}, Epoch: 1}).(*PickReply)
		if r.WorkerID != "w1" {
			t.Fatalf("pick for %s: %+v", id, r)
		}
	}
	// "started" was dispatched and runs; "unused" is never heard of again.
	b.sys.Root.Send(b.pid, &Released{WorkerID: "w1", JobID: "started"})
	if ws := b.workers(t); len(ws) != 1 || ws[0].Dispatched != 2 {
		t.Fatalf("workers %+v, want w1 with both picks counted", ws)
	}
	// Long past any dispatch timeout; the worker is alive throughout.
	for _, d := range []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute} {
		b.beat(hb, at(d))
		b.sys.Root.Send(b.pid, sweepTick{})
		b.workers(t) // swept at d: the clock may move on
	}
	if ws := b.workers(t); len(ws) != 1 || ws[0].Dispatched != 1 {
		t.Fatalf("workers %+v: want only the started job counted on w1", ws)
	}
	// The worker goes away: nothing of this node's waits on it.
	at(16 * time.Minute)
	b.sys.Root.Send(b.pid, sweepTick{})
	select {
	case id := <-evicted:
		if id != "w1" {
			t.Fatalf("evicted %s", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("w1 not evicted")
	}
	b.workers(t) // the sweep is over
	// Only the started job is told (it decides what the loss means); the
	// pick never dispatched is not.
	select {
	case ids := <-lost:
		if len(ids) != 1 || ids[0] != "started" {
			t.Fatalf("eviction reported %v lost, want only [started]: a pick never dispatched is not", ids)
		}
	default:
		t.Fatal("eviction told no job")
	}
}

// TestReaskFreesTheEarlierPick: a job that asks again is not dispatching on
// the pick it was given before (its actor restarted, or dropped the reply as
// stale): that pick's slot is freed at once, wherever the new one lands.
func TestReaskFreesTheEarlierPick(t *testing.T) {
	t.Parallel()
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n")})
	for _, id := range []string{"w1", "w2"} {
		b.beat(&capv1.Heartbeat{WorkerId: id, Pool: "a", MaxParallelJobs: 8}, time.Now())
	}
	req := &PickRequest{JobID: "j", Req: &capv1.JobRequest{JobId: "j", Topic: "job.a"}, Epoch: 1}
	first := b.ask(t, req).(*PickReply)
	req.Epoch = 2
	second := b.ask(t, req).(*PickReply)
	if first.WorkerID == "" || second.WorkerID == "" {
		t.Fatalf("picks %+v %+v", first, second)
	}
	total := int32(0)
	for _, w := range b.workers(t) {
		total += w.Dispatched
		if w.ID != second.WorkerID && w.Dispatched != 0 {
			t.Fatalf("%s still counts the first pick (workers %+v)", w.ID, b.workers(t))
		}
	}
	if total != 1 {
		t.Fatalf("%d slots counted for one job", total)
	}
}
