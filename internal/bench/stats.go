package bench

import (
	"math"
	"slices"
)

// Percentiles summarises one latency distribution, in milliseconds.
type Percentiles struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p999_ms"`
	Max   float64 `json:"max_ms"`
}

// summarize sorts ms in place and returns its percentiles (nearest rank).
func summarize(ms []float64) Percentiles {
	if len(ms) == 0 {
		return Percentiles{}
	}
	slices.Sort(ms)
	var sum float64
	for _, v := range ms {
		sum += v
	}
	return Percentiles{
		Count: len(ms), Mean: round3(sum / float64(len(ms))),
		P50: round3(rank(ms, 0.50)), P90: round3(rank(ms, 0.90)), P99: round3(rank(ms, 0.99)),
		P999: round3(rank(ms, 0.999)), Max: round3(ms[len(ms)-1]),
	}
}

// rank is the nearest-rank percentile q of sorted.
func rank(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// round3 keeps microsecond precision in milliseconds, so the JSON stays readable.
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// Histogram is a latency distribution in fixed-width buckets, written in
// the JSON for plotting. The last bucket also holds everything above its upper edge.
type Histogram struct {
	BucketMs float64 `json:"bucket_ms"`
	Counts   []int   `json:"counts"`
}

// histogramBuckets is the number of latency buckets drawn.
const histogramBuckets = 60

// histogram buckets sorted values from 0 to upper ms.
func histogram(sorted []float64, upper float64) Histogram {
	if upper <= 0 {
		upper = 1
	}
	h := Histogram{BucketMs: upper / histogramBuckets, Counts: make([]int, histogramBuckets)}
	for _, v := range sorted {
		i := int(v / h.BucketMs)
		h.Counts[max(0, min(i, histogramBuckets-1))]++
	}
	return h
}

// Timeline counts events per time bucket since the first submit.
type Timeline struct {
	BucketMs  float64 `json:"bucket_ms"`
	Submitted []int   `json:"submitted"`
	Terminal  []int   `json:"terminal"`
}

// timelineBuckets is how many buckets the run's duration is cut into; the
// bucket width is rounded to a whole number of milliseconds (at least 10).
const timelineBuckets = 100

func newTimeline(durationMs float64) Timeline {
	w := math.Max(10, math.Ceil(durationMs/timelineBuckets))
	n := int(durationMs/w) + 1
	return Timeline{BucketMs: w, Submitted: make([]int, n), Terminal: make([]int, n)}
}

func (t *Timeline) add(series []int, atMs float64) {
	i := int(atMs / t.BucketMs)
	series[max(0, min(i, len(series)-1))]++
}
