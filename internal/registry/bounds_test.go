package registry

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A registry at its bounds refuses a new worker, or a worker naming a new
// pool, and counts the refusal; known workers keep beating.
func TestBoundsRefuseNewWorkersAndPools(t *testing.T) {
	t.Parallel()
	r := New(time.Minute)
	reg := prometheus.NewRegistry()
	if err := r.SetBounds(Bounds{MaxWorkers: 3, MaxPools: 2}, reg); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, p := range []string{"a", "b", "c"} {
		w := r.Observe(beat(fmt.Sprintf("w%d", i), p), now)
		if (w != nil) != (p != "c") {
			t.Fatalf("pool %s: worker %v (want admitted only within 2 pools)", p, w)
		}
	}
	if w := r.Observe(beat("w2", "a"), now); w == nil {
		t.Fatal("a new worker in a seen pool refused below the worker bound")
	}
	if w := r.Observe(beat("w3", "a"), now); w != nil || r.Len() != 3 {
		t.Fatalf("a fourth worker admitted: %v, %d known", w, r.Len())
	}
	if w := r.Observe(beat("w0", "a"), now); w == nil {
		t.Fatal("a known worker refused at the worker bound")
	}
	// A pool stays seen after its workers are gone: its series outlives them.
	r.Sweep(now.Add(time.Hour))
	if w := r.Observe(beat("w9", "c"), now.Add(time.Hour)); w != nil {
		t.Fatal("a third pool admitted after the others emptied")
	}
	got := r.Refused()
	if got[RefusedTooManyPools] != 2 || got[RefusedTooManyWorkers] != 1 {
		t.Fatalf("refused %v", got)
	}
	c, err := reg.Gather()
	if err != nil || len(c) != 1 {
		t.Fatalf("metrics %v %v", c, err)
	}
}

func TestBoundsDefaults(t *testing.T) {
	t.Parallel()
	if b := (Bounds{}).WithDefaults(); b.MaxWorkers != MaxWorkersDefault || b.MaxPools != MaxPoolsDefault {
		t.Fatalf("%+v", b)
	}
}
