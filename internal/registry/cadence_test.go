package registry

import (
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// beatsEvery sends n heartbeats of id every interval from start (send time
// = arrival) and returns the time of the last.
func beatsEvery(r *Registry, id string, start time.Time, every time.Duration, n int) time.Time {
	at := start
	for i := range n {
		at = start.Add(time.Duration(i) * every)
		r.ObserveSent(beat(id, "p"), at, at)
	}
	return at
}

// TestRegistryTooSlowForTheTTL: a worker whose steady interval is over a
// third of the TTL is TooSlow once four gaps show it; one just inside is
// not, nor is a fast worker that loses a heartbeat, nor one with three
// gaps only; an announced interval decides from the first beat.
func TestRegistryTooSlowForTheTTL(t *testing.T) {
	t.Parallel()
	r := New(10 * time.Second)
	beatsEvery(r, "slow", t0, 5*time.Second, 4) // three gaps: not yet known
	if w := r.Get("slow"); r.TooSlow(w) || w.BeatEvery() != 0 {
		t.Fatalf("three gaps: too slow %v, interval %v; want unknown", r.TooSlow(w), w.BeatEvery())
	}
	r.ObserveSent(beat("slow", "p"), t0.Add(20*time.Second), t0.Add(20*time.Second))
	if w := r.Get("slow"); !r.TooSlow(w) || w.BeatEvery() != 5*time.Second {
		t.Fatalf("5 s beats under a 10 s TTL: too slow %v, interval %v; want too slow at 5s", r.TooSlow(w), w.BeatEvery())
	}
	beatsEvery(r, "edge", t0, 3400*time.Millisecond, 6) // 3 × 3.4 s > 10 s
	if w := r.Get("edge"); !r.TooSlow(w) {
		t.Fatal("3.4 s beats under a 10 s TTL are not too slow")
	}
	last := beatsEvery(r, "fast", t0, 3*time.Second, 6) // 3 × 3 s ≤ 10 s
	if w := r.Get("fast"); r.TooSlow(w) || w.BeatEvery() != 3*time.Second {
		t.Fatalf("3 s beats under a 10 s TTL: too slow %v, interval %v", r.TooSlow(w), w.BeatEvery())
	}
	beatsEvery(r, "fast", last.Add(6*time.Second), 3*time.Second, 3) // one beat lost: a 6 s gap
	if w := r.Get("fast"); r.TooSlow(w) {
		t.Fatal("one lost heartbeat made a fast worker too slow")
	}
	hb := beat("said", "p")
	hb.Labels = map[string]string{LabelHeartbeatInterval: "4s"}
	if w := r.Observe(hb, t0); !r.TooSlow(w) {
		t.Fatal("an announced 4 s interval under a 10 s TTL is not too slow")
	}
}

// TestRegistryLearnsTheCadenceOfAWorkerEvictedBetweenBeats: under a TTL
// shorter than its interval a worker is evicted between any two beats and
// joins again at the next; its cadence survives the evictions, so its
// interval is learned and it is found too slow, as a stock worker (no send
// times) beating every 5 s under a 3 s TTL.
func TestRegistryLearnsTheCadenceOfAWorkerEvictedBetweenBeats(t *testing.T) {
	t.Parallel()
	r := New(3 * time.Second)
	evictions := 0
	for i := range 5 {
		at := t0.Add(time.Duration(i) * 5 * time.Second)
		w := r.Observe(beat("w1", "p"), at)
		if i == 4 {
			if !r.TooSlow(w) || w.Interval != 5*time.Second || w.BeatEvery() != 5*time.Second {
				t.Fatalf("after 4 flaps: too slow %v, interval %v / %v; want too slow at 5s", r.TooSlow(w), w.Interval, w.BeatEvery())
			}
			break
		}
		evictions += len(r.Sweep(at.Add(4 * time.Second)))
	}
	if evictions != 4 {
		t.Fatalf("evictions = %d, want 4 (the TTL is under the interval)", evictions)
	}
	// A worker heard again trailKeep after its last beat was away: its
	// gaps start again.
	r.Sweep(t0.Add(time.Hour))
	if w := r.Observe(beat("w1", "p"), t0.Add(time.Hour+time.Second)); w.BeatEvery() != 0 || w.Interval != 0 {
		t.Fatalf("back after an hour: interval %v / %v, want unknown", w.Interval, w.BeatEvery())
	}
}

// TestRegistryTrailsAreBounded: evicted workers' cadences are kept for at
// most MaxWorkers workers.
func TestRegistryTrailsAreBounded(t *testing.T) {
	t.Parallel()
	r := New(3 * time.Second)
	_ = r.SetBounds(Bounds{MaxWorkers: 10}, nil)
	for round := range 3 {
		at := t0.Add(time.Duration(round) * time.Hour)
		for i := range 10 {
			r.Observe(beat("w"+strconv.Itoa(round)+"-"+strconv.Itoa(i), "p"), at)
		}
		r.Sweep(at.Add(time.Minute))
		if n := len(r.trails.m); n > 10 {
			t.Fatalf("round %d: %d trails kept, bound 10", round, n)
		}
	}
}

// TestRegistryHeartbeatsDoNotAllocate: a heartbeat from a known worker,
// with its cadence measured and checked against the TTL, allocates
// nothing, over a registry of 1,000 workers.
func TestRegistryHeartbeatsDoNotAllocate(t *testing.T) {
	const n = 1000
	r := New(10 * time.Second)
	hbs := make([]*capv1.Heartbeat, n)
	for i := range hbs {
		hbs[i] = beat("w"+strconv.Itoa(i), "p")
	}
	at := t0
	round := func() {
		at = at.Add(5 * time.Second)
		for _, hb := range hbs {
			if w := r.ObserveSent(hb, at, at); w == nil || w.BeatEvery() < 0 {
				t.Fatal("refused")
			}
		}
	}
	for range gapWindow + 1 {
		round()
	}
	if w := r.Get("w0"); !r.TooSlow(w) {
		t.Fatal("the workers' cadence was not measured")
	}
	if allocs := testing.AllocsPerRun(20, round); allocs != 0 {
		t.Fatalf("%v allocations per %d heartbeats, want 0", allocs, n)
	}
}

// TestRegistryLateBeatsCatchUpDoNotHideASlowWorker: a worker beating every
// 400 ms whose busy process sends a beat late and the next on time (a
// ticker's catch-up: 676 ms, then 124 ms) is still too slow for a 1 s TTL;
// a worker beating every 300 ms that loses one beat is not.
func TestRegistryLateBeatsCatchUpDoNotHideASlowWorker(t *testing.T) {
	t.Parallel()
	r := New(time.Second)
	at := t0
	for _, gap := range []time.Duration{0, 400, 676, 124, 400, 400} {
		at = at.Add(gap * time.Millisecond)
		r.ObserveSent(beat("slow", "p"), at, at)
	}
	if w := r.Get("slow"); !r.TooSlow(w) || w.BeatEvery() != 400*time.Millisecond {
		t.Fatalf("400 ms beats with one late: too slow %v, interval %v; want too slow at 400ms", r.TooSlow(w), w.BeatEvery())
	}
	at = t0
	for _, gap := range []time.Duration{0, 300, 300, 600, 300, 300} {
		at = at.Add(gap * time.Millisecond)
		r.ObserveSent(beat("fast", "p"), at, at)
	}
	if w := r.Get("fast"); r.TooSlow(w) || w.BeatEvery() != 300*time.Millisecond {
		t.Fatalf("300 ms beats, one lost: too slow %v, interval %v; want not, at 300ms", r.TooSlow(w), w.BeatEvery())
	}
}
