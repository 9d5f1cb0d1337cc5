package lifecycle

// A job's memory: its number fields, the Job's and its writes' size classes.

import (
	"math"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// TestNumberFieldsKeepTheirDigits: a job's number fields read as strconv
// writes them, and each keeps its digits while the job formats many more
// (its arena only appended to, a fresh one when full).
func TestNumberFieldsKeepTheirDigits(t *testing.T) {
	j := &Job{}
	type kept struct{ got, want string }
	var all []kept
	ints := []int64{0, 7, 99, 100, -1, -100, 1_764_000_000_123, math.MaxInt64, math.MinInt64}
	uints := []uint64{0, 35, 36, 1 << 40, math.MaxUint64}
	for round := range 50 {
		for _, v := range ints {
			v += int64(round)
			all = append(all, kept{j.formatInt(v), strconv.FormatInt(v, 10)})
		}
		for _, v := range uints {
			v += uint64(round)
			all = append(all, kept{j.formatUint(v, 36), strconv.FormatUint(v, 36)})
		}
		at := time.UnixMilli(1_764_000_000_000 + int64(round))
		all = append(all, kept{j.formatMs(at), strconv.FormatInt(at.UnixMilli(), 10)})
	}
	for i, k := range all {
		if k.got != k.want {
			t.Fatalf("number %d reads %q, want %q", i, k.got, k.want)
		}
	}
}

// TestNumberFieldsShareAnAllocation: a job's first numbers take one
// allocation between them (strconv: one each).
func TestNumberFieldsShareAnAllocation(t *testing.T) {
	at := time.UnixMilli(1_764_000_000_123)
	got := testing.AllocsPerRun(100, func() {
		j := &Job{}
		sinkJob = j
		_ = j.formatMs(at)
		_ = j.formatMs(at)
		_ = j.formatMs(at)
		_ = j.formatUint(1<<50, 36)
		_ = j.formatUint(1<<50, 36)
	})
	// The job itself and its arena.
	if got != 2 {
		t.Errorf("a job and five numbers: %.0f allocations, want 2", got)
	}
}

var sinkJob *Job

// TestJobFitsItsSizeClass: a Job (one allocation a job) and the 8-byte
// header the runtime puts before an object of over 512 bytes with pointers
// stay within the 1,536-byte size class; past it, each job costs 1,792
// bytes. A field added past the limit goes where its alignment wastes
// nothing (the bools together), or the limit is raised knowingly.
func TestJobFitsItsSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(Job{}); n+8 > 1536 {
		t.Errorf("a Job is %d bytes, %d with its header: past the 1,536-byte size class", n, n+8)
	}
	// The same, measured: a Job's allocation.
	if per := heapPer(func() { sinkJob = new(Job) }); per > 1536 {
		t.Errorf("a Job takes %d bytes of heap, want 1,536", per)
	}
}

// BenchmarkNumberFields: a job's number fields on the happy path (a
// dispatch's deadline, submitted, waited and slot ask, two write op ids),
// in a fresh job's arena against strconv's string each.
func BenchmarkNumberFields(b *testing.B) {
	at := time.UnixMilli(1_764_000_000_123)
	const op = uint64(0x9e3779b97f4a7c15)
	b.Run("arena", func(b *testing.B) {
		b.ReportAllocs()
		j := &Job{}
		for b.Loop() {
			j.nums = nil // a fresh job's
			sinkStr = j.formatMs(at)
			sinkStr = j.formatMs(at)
			sinkStr = j.formatMs(at)
			sinkStr = j.formatMs(at)
			sinkStr = j.formatUint(op, 36)
			sinkStr = j.formatUint(op, 36)
		}
	})
	b.Run("strconv", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sinkStr = strconv.FormatInt(at.UnixMilli(), 10)
			sinkStr = strconv.FormatInt(at.UnixMilli(), 10)
			sinkStr = strconv.FormatInt(at.UnixMilli(), 10)
			sinkStr = strconv.FormatInt(at.UnixMilli(), 10)
			sinkStr = strconv.FormatUint(op, 36)
			sinkStr = strconv.FormatUint(op, 36)
		}
	})
}

var sinkStr string

// TestDispatchWriteIsOneAllocation: a dispatch's transition, with room for
// its fields and a policy decision's (8, 10 with constraints), is one
// block of at most 896 bytes, not a block and a slice of fields.
func TestDispatchWriteIsOneAllocation(t *testing.T) {
	for _, decision := range []int{0, 8, 10} {
		if n := testing.AllocsPerRun(100, func() { sinkT = newTransition(expectUnplaced, 24+decision) }); n != 1 {
			t.Errorf("a dispatch's transition with %d decision fields: %.0f allocations, want 1", decision, n)
		}
	}
	if per := heapPer(func() { sinkT = newTransition(expectUnplaced, 32) }); per > 896 {
		t.Errorf("a dispatch's transition takes %d bytes of heap, want at most 896", per)
	}
}

var sinkT *jobstate.Transition

// heapPer is the heap bytes one call of f allocates: the least of five
// measurements of 1,000 calls (whatever else the process allocates
// meanwhile only adds).
func heapPer(f func()) uint64 {
	best := uint64(math.MaxUint64)
	for range 5 {
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		for range 1000 {
			f()
		}
		runtime.ReadMemStats(&ms1)
		best = min(best, (ms1.TotalAlloc-ms0.TotalAlloc)/1000)
	}
	return best
}
