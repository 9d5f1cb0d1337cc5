package jobactor

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/lifecycle"
)

// The index keeps what Add was told, forgets on Remove, leaves out of a
// snapshot (and prunes) only retry waits due before the cut, lists only
// the waits with no due time for verification, and Drop spares an entry
// re-added since its snapshot.
func TestAloneWaitsIndexKeepsPrunesAndDrops(t *testing.T) {
	w := NewAloneWaits()
	now := time.UnixMilli(1_000_000_000)
	w.Add("r-old", lifecycle.WaitRetry, now.Add(-time.Minute))
	w.Add("r-new", lifecycle.WaitRetry, now.Add(time.Minute))
	w.Add("a", lifecycle.WaitApproval, time.Time{})
	w.Add("q", lifecycle.WaitRate, time.Time{})
	w.Add("a", lifecycle.WaitApproval, time.Time{}) // again: one entry
	if w.Len() != 4 {
		t.Fatalf("%d entries, want 4", w.Len())
	}
	snap := w.Snapshot(now)
	kinds := map[string]lifecycle.WaitKind{}
	for _, e := range snap {
		kinds[e.JobID] = e.Kind
	}
	if len(snap) != 3 || kinds["r-new"] != lifecycle.WaitRetry || kinds["a"] != lifecycle.WaitApproval || kinds["q"] != lifecycle.WaitRate {
		t.Fatalf("snapshot %+v", snap)
	}
	var undue []AloneWait
	for from, i := 0, 0; i < aloneStripes; i++ {
		var got []AloneWait
		got, from = w.Undue(from, 1)
		undue = append(undue, got...)
		if from == 0 {
			break
		}
	}
	if len(undue) != 2 {
		t.Fatalf("undue %+v, want a and q", undue)
	}
	if n := w.Prune(now); n != 1 || w.Len() != 3 {
		t.Fatalf("pruned %d, %d left", n, w.Len())
	}
	w.Remove("q")
	w.Remove("nobody")
	before := w.Snapshot(time.Time{})
	w.Add("r-new", lifecycle.WaitRetry, now.Add(2*time.Minute)) // re-parked since the snapshot
	w.Drop(before)
	if after := w.Snapshot(time.Time{}); w.Len() != 1 || len(after) != 1 || after[0].JobID != "r-new" || !after[0].Due.Equal(now.Add(2*time.Minute)) {
		t.Fatalf("after Drop: %d entries %+v", w.Len(), after)
	}
}

// A delayed submit's entry carries its due time: it is left out of a
// snapshot and pruned when due before the cut (a ticker took it while
// Redis was intact), kept when due after it, listed for verification with
// the waits of no due time, and its id is the index's own copy.
func TestAloneWaitsIndexKeepsDelayedSubmitsByTheirDueTime(t *testing.T) {
	w := NewAloneWaits()
	now := time.UnixMilli(1_000_000_000)
	buf := []byte("d-new")
	w.AddDelayed(string(buf[:]), now.Add(time.Hour))
	buf[0] = 'x' // the caller's memory changes; the index keeps its copy
	w.AddDelayed("d-old", now.Add(-time.Second))
	w.Add("a", lifecycle.WaitApproval, time.Time{})
	snap := w.Snapshot(now)
	got := map[string]AloneWait{}
	for _, e := range snap {
		got[e.JobID] = e
	}
	if d, ok := got["d-new"]; len(snap) != 2 || !ok || d.Kind != lifecycle.WaitDelayed || !d.Due.Equal(now.Add(time.Hour)) || got["a"].Kind != lifecycle.WaitApproval {
		t.Fatalf("snapshot %+v, want d-new (delayed, due in an hour) and a", snap)
	}
	undue, _ := w.Undue(0, 1_000)
	if len(undue) != 3 {
		t.Fatalf("verifiable %+v, want both delayed submits and the approval", undue)
	}
	if n := w.Prune(now); n != 1 || w.Len() != 2 {
		t.Fatalf("pruned %d, %d left; want d-old pruned", n, w.Len())
	}
	w.Drop([]AloneWait{got["d-new"]})
	if w.Len() != 1 {
		t.Fatalf("%d left after dropping d-new, want the approval", w.Len())
	}
}

// BenchmarkAloneWaitsHeap measures the live heap the index costs per wait
// (B/wait), for b.N waits of 40-byte job ids (the ids' own bytes are the
// job's, counted apart as id_B/wait); set -benchtime=10000x or 1000000x.
func BenchmarkAloneWaitsHeap(b *testing.B) {
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = "job-" + strconv.FormatInt(int64(1e17)+int64(i), 10) + "-0123456789abcdef"
	}
	due := time.Now().Add(time.Hour)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	w := NewAloneWaits()
	for i, id := range ids {
		if i%3 == 0 {
			w.Add(id, lifecycle.WaitApproval, time.Time{})
		} else {
			w.Add(id, lifecycle.WaitRetry, due)
		}
	}
	b.StopTimer()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(b.N), "B/wait")
	b.ReportMetric(float64(len(ids[0])), "id_B/wait")
	runtime.KeepAlive(w)
	runtime.KeepAlive(ids)
}

// BenchmarkAloneWaitsAddRemove: a park and its wake (Add, then the Hold's
// Remove) against an index holding 100,000 other waits.
func BenchmarkAloneWaitsAddRemove(b *testing.B) {
	w := NewAloneWaits()
	for i := 0; i < 100_000; i++ {
		w.Add("other-"+strconv.Itoa(i), lifecycle.WaitApproval, time.Time{})
	}
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = "job-" + strconv.Itoa(i)
	}
	due := time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := ids[i%len(ids)]
		w.Add(id, lifecycle.WaitRetry, due)
		w.Remove(id)
	}
}
