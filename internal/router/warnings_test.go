package router

import (
	"strconv"
	"testing"
	"time"
)

// TestRecentWarningsRepeatAfterTheirPeriodAndForgetOldIds: a worker id is
// warned about once per period, again after it; ids not warned about for a
// period are dropped, so a node that sees thousands of misconfigured
// workers come and go under new ids keeps only the last period's.
func TestRecentWarningsRepeatAfterTheirPeriodAndForgetOldIds(t *testing.T) {
	w := recentWarnings{every: 10 * time.Minute}
	t0 := time.Unix(1_800_000_000, 0)
	if !w.due("w1", t0) || w.due("w1", t0.Add(9*time.Minute)) {
		t.Fatal("w1: want a warning at first, none within the period")
	}
	if !w.due("w1", t0.Add(10*time.Minute)) {
		t.Fatal("w1: want a warning again once the period has passed")
	}
	// 5,000 workers warned about, each under a new id, over 50 minutes.
	for i := 0; i < 5000; i++ {
		at := t0.Add(10*time.Minute + time.Duration(i)*600*time.Millisecond)
		if !w.due("gone-"+strconv.Itoa(i), at) {
			t.Fatalf("gone-%d: no warning for a new id", i)
		}
	}
	// Two periods' worth at most: the last period's ids and those not yet
	// pruned from the one before.
	if n := w.size(); n > 2*1000+1 {
		t.Fatalf("%d ids remembered after 5,000 over 50 minutes, want at most 2,001 (one per 600 ms over two periods)", n)
	}
	w.prune(t0.Add(3 * time.Hour))
	if n := w.size(); n != 0 {
		t.Fatalf("%d ids remembered two hours after the last warning, want 0", n)
	}
}
