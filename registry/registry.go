// Package registry keeps the live view of workers built from CAP heartbeats.
// A Registry is owned by one goroutine (the router actor) and is not safe for
// concurrent use.
package registry

import (
	"strings"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// TTLDefault is how long a worker stays live without a heartbeat. CAP SDK
// workers beat every 5 s, so 30 s tolerates five lost beats.
const TTLDefault = 30 * time.Second

// LabelDispatch is the heartbeat label by which a worker says how it wants
// jobs delivered. LabelDispatch=DispatchDirect means the worker subscribes to
// worker.<id>.jobs and the router may send it jobs there; any other value, or
// none (stock CAP SDK workers), means the worker only listens on its pool
// subject (the job's topic), so Troupe publishes there.
const (
	LabelDispatch  = "troupe.dispatch"
	DispatchDirect = "direct"
)

// Worker is one live worker as the registry sees it.
type Worker struct {
	ID           string
	Pool         string
	Region       string
	Type         string
	CPULoad      float32
	GPUUtil      float32
	ActiveJobs   int32 // as last reported by the worker
	MaxParallel  int32
	Capabilities []string
	Labels       map[string]string
	Direct       bool
	LastSeen     time.Time
	// Dispatched counts jobs this node sent the worker since its last
	// heartbeat, so a burst between two heartbeats spreads over the pool.
	Dispatched int32

	poolPos int // index in its pool's slice
}

// Load is the worker's score for least-loaded placement: lower is better.
func (w *Worker) Load() float64 {
	return float64(w.ActiveJobs+w.Dispatched) + float64(w.CPULoad)/100 + float64(w.GPUUtil)/100
}

// Overloaded reports whether the worker should not take more work:
// (active+dispatched)/max_parallel ≥ 0.9, cpu ≥ 90 or gpu ≥ 90.
func (w *Worker) Overloaded() bool {
	if w.MaxParallel > 0 && float64(w.ActiveJobs+w.Dispatched)/float64(w.MaxParallel) >= 0.9 {
		return true
	}
	return w.CPULoad >= 90 || w.GPUUtil >= 90
}

// HasLabels reports whether the worker's labels include every want pair.
func (w *Worker) HasLabels(want map[string]string) bool {
	for k, v := range want {
		if got, ok := w.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Registry maps worker ids to workers, with a per-pool index.
type Registry struct {
	ttl     time.Duration
	workers map[string]*Worker
	pools   map[string][]*Worker
}

// New returns an empty registry with liveness ttl (TTLDefault if ≤ 0).
func New(ttl time.Duration) *Registry {
	if ttl <= 0 {
		ttl = TTLDefault
	}
	return &Registry{ttl: ttl, workers: map[string]*Worker{}, pools: map[string][]*Worker{}}
}

// TTL returns the liveness TTL.
func (r *Registry) TTL() time.Duration { return r.ttl }

// Observe records a heartbeat seen at now and returns the worker.
func (r *Registry) Observe(hb *capv1.Heartbeat, now time.Time) *Worker {
	w, ok := r.workers[hb.WorkerId]
	if !ok {
		w = &Worker{ID: hb.WorkerId}
		r.workers[hb.WorkerId] = w
	} else if w.Pool != hb.Pool {
		r.removeFromPool(w)
		ok = false
	}
	w.Pool, w.Region, w.Type = hb.Pool, hb.Region, hb.Type
	w.CPULoad, w.GPUUtil = hb.CpuLoad, hb.GpuUtilization
	w.ActiveJobs, w.MaxParallel = hb.ActiveJobs, hb.MaxParallelJobs
	w.Capabilities, w.Labels = hb.Capabilities, hb.Labels
	w.Direct = strings.EqualFold(hb.Labels[LabelDispatch], DispatchDirect)
	w.LastSeen = now
	w.Dispatched = 0
	if !ok {
		w.poolPos = len(r.pools[w.Pool])
		r.pools[w.Pool] = append(r.pools[w.Pool], w)
	}
	return w
}

// Get returns a worker by id, or nil.
func (r *Registry) Get(id string) *Worker { return r.workers[id] }

// Live reports whether w's last heartbeat is within the TTL at now.
func (r *Registry) Live(w *Worker, now time.Time) bool { return now.Sub(w.LastSeen) < r.ttl }

// Pool returns the workers of pool (live or not yet swept). The slice is the
// registry's own: callers must not keep or modify it.
func (r *Registry) Pool(pool string) []*Worker { return r.pools[pool] }

// Len returns the number of known workers.
func (r *Registry) Len() int { return len(r.workers) }

// Sweep removes workers not seen within the TTL and returns them.
func (r *Registry) Sweep(now time.Time) []*Worker {
	var gone []*Worker
	for id, w := range r.workers {
		if !r.Live(w, now) {
			delete(r.workers, id)
			r.removeFromPool(w)
			gone = append(gone, w)
		}
	}
	return gone
}

// LivePerPool counts live workers by pool.
func (r *Registry) LivePerPool(now time.Time) map[string]int {
	out := map[string]int{}
	for p, ws := range r.pools {
		for _, w := range ws {
			if r.Live(w, now) {
				out[p]++
			}
		}
	}
	return out
}

func (r *Registry) removeFromPool(w *Worker) {
	ws := r.pools[w.Pool]
	last := len(ws) - 1
	if w.poolPos > last || ws[w.poolPos] != w {
		return
	}
	ws[w.poolPos] = ws[last]
	ws[w.poolPos].poolPos = w.poolPos
	ws[last] = nil
	ws = ws[:last]
	if len(ws) == 0 {
		delete(r.pools, w.Pool)
	} else {
		r.pools[w.Pool] = ws
	}
}
