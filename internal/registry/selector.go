package registry

import (
	"hash/maphash"
	"time"
)

// Label selectors: jobs with placement labels (region=eu, gpu=a100) need
// the least-loaded worker among those carrying the labels. Scanning the
// pool for them is O(n) per pick, and walking the pool heap in load order
// degrades exactly when it matters: the labelled workers are the busy ones
// and sink below every idle unlabelled worker. So the registry builds, on
// first demand, a placement index per (pool, label set) that jobs actually
// ask for, and keeps it like the pool's own: a heap by score, plus counts.
// Label sets nobody asks for cost nothing; an index nobody has used for
// SelectorIdle is dropped at the sweep.

const (
	// SelectorIdle is how long an unused selector index is kept. Label sets
	// come from job templates and recur; ten minutes keeps a set used by a
	// periodic job while letting one-off sets go.
	SelectorIdle = 10 * time.Minute
	// MaxSelectorsPerPool bounds the indexes per pool, and with them the
	// work a dispatch does (one heap fix per selector the worker is in).
	// Past it the least recently used selector is dropped.
	MaxSelectorsPerPool = 64
)

type selector struct {
	index
	key      uint64
	pairs    map[string]string
	lastUsed time.Time
	pool     *poolIndex
}

// Selector is the placement index of one label set in one pool. It is
// owned by the registry; use it only on the registry's goroutine and only
// until the next registry call that may sweep.
type Selector struct{ s *selector }

// Top returns the first eligible worker carrying the labels, or nil.
func (s Selector) Top() *Worker {
	if s.s == nil {
		return nil
	}
	return s.s.top()
}

// OverloadedCount is how many workers carrying the labels are overloaded.
func (s Selector) OverloadedCount() int {
	if s.s == nil {
		return 0
	}
	return s.s.overloaded
}

// AwayCount is how many workers carrying the labels another replica
// places jobs on.
func (s Selector) AwayCount() int {
	if s.s == nil {
		return 0
	}
	return s.s.away
}

// StaleCount is how many workers carrying the labels were found stale at
// pick time and wait for a heartbeat or the sweep.
func (s Selector) StaleCount() int {
	if s.s == nil {
		return 0
	}
	return s.s.stale
}

// pairHash hashes one label pair; pair hashes are summed, so a label set's
// key does not depend on map order and needs no sorting or allocation.
func (r *Registry) pairHash(k, v string) uint64 {
	return maphash.String(r.seed, k)*0x9E3779B97F4A7C15 ^ maphash.String(r.seed, v)
}

// Select returns pool's index for the labels of job that keep accepts
// (keep filters out labels that describe the job rather than where it runs),
// building it with one scan of the pool on first use. Without such labels,
// or without the pool, the Selector is empty (Top returns nil).
func (r *Registry) Select(pool string, job map[string]string, keep func(key string) bool, now time.Time) Selector {
	p := r.pools[pool]
	if p == nil {
		return Selector{}
	}
	var key uint64
	n := 0
	for k, v := range job {
		if keep(k) {
			key += r.pairHash(k, v)
			n++
		}
	}
	if n == 0 {
		return Selector{}
	}
	for _, s := range p.selectors[key] {
		if sameSelection(s.pairs, n, job) {
			s.lastUsed = now
			return Selector{s}
		}
	}
	pairs := make(map[string]string, n)
	for k, v := range job {
		if keep(k) {
			pairs[k] = v
		}
	}
	return Selector{r.addSelector(p, key, pairs, now)}
}

// sameSelection reports whether job's kept labels (n of them) are exactly
// pairs: guards against two label sets whose keys collide.
func sameSelection(pairs map[string]string, n int, job map[string]string) bool {
	if len(pairs) != n {
		return false
	}
	for k, v := range pairs {
		if got, ok := job[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (r *Registry) addSelector(p *poolIndex, key uint64, pairs map[string]string, now time.Time) *selector {
	if p.nSelectors >= MaxSelectorsPerPool {
		var lru *selector
		for _, ss := range p.selectors {
			for _, s := range ss {
				if lru == nil || s.lastUsed.Before(lru.lastUsed) {
					lru = s
				}
			}
		}
		r.dropSelector(lru)
	}
	s := &selector{key: key, pairs: pairs, lastUsed: now, pool: p}
	if p.selectors == nil {
		p.selectors = map[uint64][]*selector{}
	}
	p.selectors[key] = append(p.selectors[key], s)
	p.nSelectors++
	for _, w := range p.members {
		if w.HasLabels(pairs) {
			r.join(w, s)
		}
	}
	return s
}

// join makes w a member of s, placed as w is placed.
func (r *Registry) join(w *Worker, s *selector) {
	m := s.add(w)
	w.sel = append(w.sel, m)
	s.enter(m.id, w.placed)
}

func (r *Registry) dropSelector(s *selector) {
	p := s.pool
	for _, w := range p.members {
		for i, m := range w.sel {
			if m.ix == &s.index {
				last := len(w.sel) - 1
				w.sel[i] = w.sel[last]
				w.sel[last] = member{}
				w.sel = w.sel[:last]
				break
			}
		}
	}
	ss := p.selectors[s.key]
	for i, x := range ss {
		if x == s {
			ss = append(ss[:i], ss[i+1:]...)
			break
		}
	}
	if len(ss) == 0 {
		delete(p.selectors, s.key)
	} else {
		p.selectors[s.key] = ss
	}
	p.nSelectors--
}

// linkSelectors joins w to every selector of its pool whose labels it
// carries; unlinkSelectors undoes that. Both keep w's placement.
func (r *Registry) linkSelectors(w *Worker) {
	for _, ss := range w.pool.selectors {
		for _, s := range ss {
			if w.HasLabels(s.pairs) {
				r.join(w, s)
			}
		}
	}
}

func (r *Registry) unlinkSelectors(w *Worker) {
	for i, m := range w.sel {
		m.ix.leave(m.id, w.placed)
		m.ix.release(m.id)
		w.sel[i] = member{}
	}
	w.sel = w.sel[:0]
}

// dropIdleSelectors forgets selectors unused since before cutoff.
func (r *Registry) dropIdleSelectors(cutoff time.Time) {
	for _, p := range r.pools {
		var idle []*selector
		for _, ss := range p.selectors {
			for _, s := range ss {
				if s.lastUsed.Before(cutoff) {
					idle = append(idle, s)
				}
			}
		}
		for _, s := range idle {
			r.dropSelector(s)
		}
	}
}

func labelsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if got, ok := b[k]; !ok || got != v {
			return false
		}
	}
	return true
}
