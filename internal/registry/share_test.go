package registry

import (
	"testing"

	"github.com/troupe-run/troupe/proto/capv1"
)

// TestShareSplitsAWorkersSlots: replicas that split a worker's slots get
// shares that add up to its max_parallel (the remainder to the first
// ranks); a replica at its share has no room and places nothing there
// until one of its jobs ends.
func TestShareSplitsAWorkersSlots(t *testing.T) {
	r := New(0)
	w := r.Observe(&capv1.Heartbeat{WorkerId: "w1", Pool: "a", MaxParallelJobs: 8}, t0)
	if r.Share(w) != -1 {
		t.Fatalf("share %d before any split, want -1", r.Share(w))
	}
	sum := int32(0)
	for rank := range 3 {
		r.SetShare(w, rank, 3)
		sum += r.Share(w)
	}
	if sum != 8 {
		t.Fatalf("shares of 3 replicas add up to %d, want 8", sum)
	}
	r.SetShare(w, 2, 3) // 8/3 = 2, no remainder slot
	if r.Share(w) != 2 || r.Room(w) != 2 || r.Away(w) || r.Top("a") != w {
		t.Fatalf("share %d room %d away %v, want 2, 2, false and placeable", r.Share(w), r.Room(w), r.Away(w))
	}
	r.CountDispatch(w)
	r.CountDispatch(w)
	if r.Room(w) != 0 || !r.Away(w) || r.Top("a") != nil {
		t.Fatalf("at its share: room %d away %v top %v, want 0, true, none", r.Room(w), r.Away(w), r.Top("a"))
	}
	r.CountDone(w)
	if r.Room(w) != 1 || r.Away(w) || r.Top("a") != w {
		t.Fatalf("below its share again: room %d away %v, want 1, false and placeable", r.Room(w), r.Away(w))
	}
	r.SetShare(w, 0, 1) // alone: the whole worker
	if r.Share(w) != -1 || r.Room(w) != 7 {
		t.Fatalf("alone: share %d room %d, want -1, 7", r.Share(w), r.Room(w))
	}
}
