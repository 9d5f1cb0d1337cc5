package intake

import (
	"strconv"
	"testing"

	capv1 "github.com/troupe-run/troupe/proto/capv1"
)

// TestSettledSetTellsResultsApart: the settled set answers for the exact
// result its job's actor settled (job id, worker and status), once; a
// result of the same job from another worker or with another status is
// not taken for it; a heard result is heard until its actor settles it,
// and a heard mark never hides a settle.
func TestSettledSetTellsResultsApart(t *testing.T) {
	var s settledSet
	done := capv1.JobStatus_JOB_STATUS_SUCCEEDED
	k := settledKey{job: "j-1", worker: "w1", status: done}
	if got := s.take(k); got != markNone {
		t.Fatalf("empty set: take = %d, want markNone", got)
	}
	s.heard(k)
	if got := s.take(k); got != markHeard {
		t.Fatalf("heard: take = %d, want markHeard", got)
	}
	if got := s.take(k); got != markHeard {
		t.Fatalf("heard, taken once: take = %d, want markHeard still (only a settle is taken)", got)
	}
	s.add(k)
	s.heard(k) // a heard copy after the settle leaves it settled
	for _, other := range []settledKey{
		{job: "j-1", worker: "w2", status: done},
		{job: "j-1", worker: "w1", status: capv1.JobStatus_JOB_STATUS_FAILED},
		{job: "j-2", worker: "w1", status: done},
	} {
		if got := s.take(other); got == markSettled {
			t.Fatalf("%+v taken as settled for %+v", other, k)
		}
	}
	if got := s.take(k); got != markSettled {
		t.Fatalf("settled: take = %d, want markSettled", got)
	}
	if got := s.take(k); got != markNone {
		t.Fatalf("settled, taken once: take = %d, want markNone (forgotten)", got)
	}
}

// BenchmarkSettledSet is a heard result's work in the settled set on a node
// with live results of other jobs in it: heard when its own copy arrives,
// add when its actor settles it, take when the shared copy arrives.
func BenchmarkSettledSet(b *testing.B) {
	for _, live := range []int{2048, 16384} {
		b.Run("live="+strconv.Itoa(live), func(b *testing.B) {
			var s settledSet
			const ring = 1 << 16
			keys := make([]settledKey, ring)
			for i := range keys {
				keys[i] = settledKey{job: "bench-job-" + strconv.Itoa(1000000+i) + "-1", worker: "worker-" + strconv.Itoa(i%10),
					status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
			}
			for i := 0; i < live; i++ {
				s.heard(keys[i])
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := keys[(i+live)%ring]
				s.heard(k)
				s.add(k)
				if s.take(k) != markSettled {
					b.Fatal("not settled")
				}
				s.take(keys[i%ring]) // an older result's shared copy: forgotten or heard
			}
		})
	}
}
