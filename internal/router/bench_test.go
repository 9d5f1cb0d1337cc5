package router

import (
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/proto/capv1"
)

// benchStrategy returns a strategy over n live workers in one pool, with
// loads spread so the heap has real work to do.
func benchStrategy(b *testing.B, n int, labelled bool) (*Strategy, time.Time) {
	b.Helper()
	cfg, err := ParsePools([]byte("topics:\n  job.bench: bench\n"))
	if err != nil {
		b.Fatal(err)
	}
	reg := registry.New(time.Hour)
	now := time.Now()
	for i := range n {
		hb := &capv1.Heartbeat{WorkerId: "w" + strconv.Itoa(i), Pool: "bench",
			ActiveJobs: int32(i % 7), CpuLoad: float32(i % 50)}
		if labelled && i%10 == 0 {
			hb.Labels = map[string]string{"zone": "a"}
		}
		reg.Observe(hb, now)
	}
	return NewStrategy(cfg, reg, nil, nil), now
}

// BenchmarkPick measures one placement decision (pick + dispatch count) in
// a pool of 10, 1,000 and 10,000 live workers. Target: ≤ 2 µs and 0 allocs
// at 1,000, growing no faster than log n.
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			s, now := benchStrategy(b, n, false)
			req := &capv1.JobRequest{JobId: "j", Topic: "job.bench"}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if p := s.Pick(req, now); p.Worker == nil {
					b.Fatal(p.Reason, p.Detail)
				}
			}
		})
	}
}

// BenchmarkPickLabels measures picks that must carry a placement label held
// by one worker in ten (the bounded best-first walk).
func BenchmarkPickLabels(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			s, now := benchStrategy(b, n, true)
			req := &capv1.JobRequest{JobId: "j", Topic: "job.bench", Labels: map[string]string{"zone": "a"}}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if p := s.Pick(req, now); p.Worker == nil {
					b.Fatal(p.Reason, p.Detail)
				}
			}
		})
	}
}
