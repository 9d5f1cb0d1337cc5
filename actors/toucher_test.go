package actors

import (
	"testing"
	"time"
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
