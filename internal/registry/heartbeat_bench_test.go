package registry

import (
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// BenchmarkRegistryHeartbeat measures one heartbeat from a known worker, in
// a registry of 1,000 workers of one pool beating in turn every 5 s
// (interval learning and the cadence check included).
func BenchmarkRegistryHeartbeat(b *testing.B) {
	const n = 1000
	r := New(10 * time.Second)
	hbs := make([]*capv1.Heartbeat, n)
	for i := range hbs {
		hbs[i] = &capv1.Heartbeat{WorkerId: "w" + strconv.Itoa(i), Pool: "p", MaxParallelJobs: 4}
	}
	at := t0
	for range 5 {
		at = at.Add(5 * time.Second)
		for _, hb := range hbs {
			r.ObserveSent(hb, at, at)
		}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i%n == 0 {
			at = at.Add(5 * time.Second)
		}
		r.ObserveSent(hbs[i%n], at, at)
		i++
	}
}
