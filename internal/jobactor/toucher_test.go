package jobactor

import (
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/troupe-run/troupe/internal/lifecycle"
)

// touchCount is a delivery that counts its in-progress signals.
type touchCount struct{ n int }

func (d *touchCount) Ack() error                       { return nil }
func (d *touchCount) NakWithDelay(time.Duration) error { return nil }
func (d *touchCount) InProgress() error                { d.n++; return nil }

// TestToucherTouchesEachWaitOnSchedule: a wait is touched TouchFirst after
// it is added and every TouchEvery after, until removed; a removed wait is
// never touched again, and a wait added again starts over.
func TestToucherTouchesEachWaitOnSchedule(t *testing.T) {
	tc := &Toucher{maxAge: 24 * time.Hour, waits: map[string]*touched{}, stop: make(chan struct{})} // no goroutine: due is driven here
	a, b := &touchCount{}, &touchCount{}
	start := time.Now()
	tc.Add("a", []Delivery{a})
	tc.Add("b", []Delivery{b, nil})
	touch := func(at time.Duration) {
		for _, d := range tc.due(start.Add(at), nil) {
			_ = d.InProgress()
		}
	}
	touch(TouchFirst / 2)
	if a.n != 0 || b.n != 0 {
		t.Fatalf("touched before TouchFirst: a %d, b %d", a.n, b.n)
	}
	touch(TouchFirst + 10*time.Millisecond)
	if a.n != 1 || b.n != 1 {
		t.Fatalf("after TouchFirst: a %d, b %d; want 1 each", a.n, b.n)
	}
	touch(TouchFirst + TouchEvery/2)
	if a.n != 1 || b.n != 1 {
		t.Fatalf("touched again within TouchEvery: a %d, b %d", a.n, b.n)
	}
	tc.Remove("a")
	touch(TouchFirst + TouchEvery + 20*time.Millisecond)
	if a.n != 1 || b.n != 2 {
		t.Fatalf("after TouchEvery: a %d (removed), b %d; want 1 and 2", a.n, b.n)
	}
	for i := 2; i < 2000; i++ { // many rounds: the queues stay bounded by the waits
		touch(TouchFirst + time.Duration(i)*TouchEvery + 30*time.Millisecond)
	}
	if b.n != 2000 || a.n != 1 || tc.Len() != 1 {
		t.Fatalf("after 2000 rounds: b %d, a %d, kept %d", b.n, a.n, tc.Len())
	}
	if n := len(tc.touched.q) - tc.touched.head; n != 1 {
		t.Fatalf("%d entries queued for one wait", n)
	}
	if tc.Touches() != 2001 {
		t.Fatalf("touches counted %d, want 2001", tc.Touches())
	}
}

// TestToucherGivesUpAfterMaxAge: a wait left behind (its actor gone without
// removing it) is touched no longer than maxAge, so JetStream offers its
// submit again.
func TestToucherGivesUpAfterMaxAge(t *testing.T) {
	tc := &Toucher{maxAge: time.Minute, waits: map[string]*touched{}, stop: make(chan struct{})}
	d := &touchCount{}
	start := time.Now()
	tc.Add("left", []Delivery{d})
	for at := TouchFirst; at < 3*time.Minute; at += TouchEvery {
		for _, x := range tc.due(start.Add(at+10*time.Millisecond), nil) {
			_ = x.InProgress()
		}
	}
	if max := int(time.Minute/TouchEvery) + 1; d.n == 0 || d.n > max {
		t.Fatalf("touched %d times, want 1..%d (a minute's worth)", d.n, max)
	}
	if n := len(tc.touched.q) - tc.touched.head + len(tc.fresh.q) - tc.fresh.head; n != 0 {
		t.Fatalf("%d entries still queued", n)
	}
}

// TestToucherForgetsExpiredWaits: a wait given up after maxAge is deleted,
// not only no longer touched, so a dead actor leaves nothing behind.
func TestToucherForgetsExpiredWaits(t *testing.T) {
	tc := &Toucher{maxAge: time.Minute, waits: map[string]*touched{}, stop: make(chan struct{})}
	start := time.Now()
	for i := range 100 {
		tc.Add("left-"+string(rune('a'+i%26))+string(rune('a'+i/26)), []Delivery{&touchCount{}})
	}
	tc.Add("kept", []Delivery{&touchCount{}})
	tc.due(start.Add(TouchFirst+time.Millisecond), nil)
	if tc.Len() != 101 {
		t.Fatalf("kept %d waits before maxAge, want 101", tc.Len())
	}
	tc.mu.Lock()
	tc.waits["kept"].until = start.Add(time.Hour) // a wait younger than maxAge
	tc.mu.Unlock()
	tc.due(start.Add(time.Minute+TouchEvery), nil)
	if tc.Len() != 1 {
		t.Fatalf("kept %d waits after maxAge, want 1 (the young one)", tc.Len())
	}
}

// TestToucherStopsTickingWhenIdle: once its last wait expires, the
// Toucher's goroutine stops ticking.
func TestToucherStopsTickingWhenIdle(t *testing.T) {
	tc := NewToucher(10 * time.Millisecond)
	defer tc.Stop()
	tc.Add("left", []Delivery{&touchCount{}})
	deadline := time.Now().Add(10 * time.Second)
	for tc.Len() > 0 && time.Now().Before(deadline) { // expires at its first touch, TouchFirst
		time.Sleep(50 * time.Millisecond)
	}
	if tc.Len() != 0 {
		t.Fatalf("expired wait still kept after 10 s")
	}
	tc.mu.Lock()
	before := tc.ticks
	tc.mu.Unlock()
	time.Sleep(4 * touchTick)
	tc.mu.Lock()
	after := tc.ticks
	tc.mu.Unlock()
	if after != before {
		t.Fatalf("idle Toucher ticked %d times in %v", after-before, 4*touchTick)
	}
}

// TestToucherReusesAWaitOnlyOnceItLeftItsQueue: a removed wait is kept for
// a later Add only once it was dropped at its queue's head; the job that
// takes it is touched on its own schedule, the removed one never again.
func TestToucherReusesAWaitOnlyOnceItLeftItsQueue(t *testing.T) {
	tc := newToucher(24 * time.Hour) // no goroutine: due is driven here
	a, b := &touchCount{}, &touchCount{}
	start := time.Now()
	tc.Add("a", []Delivery{a})
	wa := tc.waits["a"]
	tc.Remove("a")
	if len(tc.free) != 0 {
		t.Fatal("a removed wait still in its queue was kept for reuse")
	}
	tc.due(start.Add(TouchFirst+10*time.Millisecond), nil) // drops it at the head
	if len(tc.free) != 1 {
		t.Fatalf("%d waits kept after the removed one was dropped, want 1", len(tc.free))
	}
	tc.Add("b", []Delivery{b})
	if tc.waits["b"] != wa || len(tc.free) != 0 {
		t.Fatal("Add did not take the kept wait")
	}
	for _, d := range tc.due(time.Now().Add(TouchFirst+10*time.Millisecond), nil) {
		_ = d.InProgress()
	}
	if a.n != 0 || b.n != 1 {
		t.Fatalf("touches: removed a %d, b %d; want 0 and 1", a.n, b.n)
	}
}

// keptDelivery is a delivery its fetch loop keeps in progress.
type keptDelivery struct{ touchCount }

func (*keptDelivery) KeptInProgress() bool { return true }

// TestWaitOnlyKeptElsewhereIsNotAdded: the actor adds a wait to the
// Toucher only when some delivery of it is not kept in progress by its
// fetch loop, removes only what it added, and a later wait of the job with
// nothing to touch drops an earlier one that had; the unwritten-wait count
// and its metric move for every wait alike.
func TestWaitOnlyKeptElsewhereIsNotAdded(t *testing.T) {
	tc := newToucher(time.Hour)
	env := &Env{Toucher: tc, Unwritten: &atomic.Int64{}, Metrics: NewMetrics(nil)}
	a := &JobActor{env: env, id: "job-1"}
	kept, plain := &keptDelivery{}, &touchCount{}
	if Touches([]lifecycle.Delivery{kept, nil}) || !Touches([]lifecycle.Delivery{kept, plain}) || Touches(nil) {
		t.Fatal("Touches: want true only with a delivery not kept elsewhere")
	}
	grace := func(d int64, ds ...lifecycle.Delivery) {
		a.do(nil, &lifecycle.Grace{Delta: d, Deliveries: ds})
	}
	grace(1, kept)
	if tc.Len() != 0 || a.touching || env.Unwritten.Load() != 1 {
		t.Fatalf("a wait kept elsewhere: %d kept, touching %v, unwritten %d", tc.Len(), a.touching, env.Unwritten.Load())
	}
	grace(-1)
	if tc.Len() != 0 || env.Unwritten.Load() != 0 {
		t.Fatalf("after its end: %d kept, unwritten %d", tc.Len(), env.Unwritten.Load())
	}
	grace(1, kept, plain)
	if tc.Len() != 1 || !a.touching {
		t.Fatalf("a wait with a plain delivery: %d kept, touching %v", tc.Len(), a.touching)
	}
	for _, d := range tc.due(time.Now().Add(TouchFirst+time.Second), nil) {
		_ = d.InProgress()
	}
	if plain.n != 1 || kept.n != 0 {
		t.Fatalf("touched: plain %d, kept %d; want 1 and 0", plain.n, kept.n)
	}
	grace(1, kept) // a wait again, nothing to touch: the earlier one goes
	if tc.Len() != 0 || a.touching {
		t.Fatalf("an earlier wait left: %d kept, touching %v", tc.Len(), a.touching)
	}
	grace(-1)
	grace(1, plain)
	grace(-1)
	if tc.Len() != 0 || a.touching || env.Unwritten.Load() != 1 {
		t.Fatalf("after the last wait: %d kept, touching %v, unwritten %d", tc.Len(), a.touching, env.Unwritten.Load())
	}
	var m dto.Metric
	if err := env.Metrics.UnwrittenWaits.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 4 {
		t.Fatalf("unwritten waits counted %v, want 4", got)
	}
}
