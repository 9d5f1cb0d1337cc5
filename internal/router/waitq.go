package router

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The capacity wait queue. A job that finds no room in its pools
// (pool_overloaded, no_workers) waits here, in the router's memory, until a
// slot frees: one of the pool's jobs is answered or ends on any replica, a
// heartbeat shows room, or a worker joins. It is then placed on the
// least-loaded worker with room and told so by a Placed message. Nothing of
// the wait touches Redis: the job wrote SCHEDULED once when it began to
// wait, and its lock, like every held lock, is kept by the node's lease.
//
// Order: higher priority first (critical, interactive, unspecified, batch);
// within a priority, tenants take turns (one tenant's burst cannot starve
// another's single job); within a tenant, oldest submit first.
//
// A job whose candidate pools are several waits in each of them (one entry,
// linked from each pool's queue); placing it through one leaves a dead link
// in the others, skipped when met and compacted when they outnumber the
// live ones.

// waiter is one waiting job.
type waiter struct {
	jobID  string
	pid    *actor.PID
	req    *capv1.JobRequest
	ticket uint64
	tenant string
	rank   int   // priority rank: higher goes first
	submit int64 // submit time, unix ms (0: unknown)
	seq    uint64
	pools  []string
	pool1  [1]string // pools' backing array when there is one pool (most jobs)
	gone   bool      // placed, withdrawn or replaced: links to it are dead
	// reason is why it waits (pool_overloaded, no_workers, stale_worker);
	// since is when it began to wait here.
	reason jobstate.Reason
	since  time.Time
}

// priorityRank orders CAP priorities for the queue.
func priorityRank(p capv1.JobPriority) int {
	switch p {
	case capv1.JobPriority_JOB_PRIORITY_CRITICAL:
		return 3
	case capv1.JobPriority_JOB_PRIORITY_INTERACTIVE:
		return 2
	case capv1.JobPriority_JOB_PRIORITY_BATCH:
		return 0
	}
	return 1
}

const ranks = 4

// waitQueue is one pool's queue.
type waitQueue struct {
	levels [ranks]level
	links  int // entries held, dead ones included
	live   int
}

// level is one priority's tenants, served in turn.
type level struct {
	tenants map[string]*tenantQueue
	ring    []*tenantQueue // tenants with entries, in turn order
	next    int
}

// tenantQueue is one tenant's waiters at one priority, oldest first.
type tenantQueue struct {
	name string
	h    waiterHeap
}

// waiterHeap is a tenant's waiters, a binary min-heap by (submit, seq):
// each entry carries its order's key, so sifting compares entries in the
// heap's own array instead of reaching each waiter through its pointer,
// and the sifts are typed (container/heap's interface calls went through
// Less and Swap; the router's pops were ~2 % of node CPU, issue 33 round
// 9). The same order as before: seq is unique, so no two entries tie.
type waiterHeap []waitEntry

type waitEntry struct {
	submit int64
	seq    uint64
	w      *waiter
}

// before reports whether a is served before b.
func (a *waitEntry) before(b *waitEntry) bool {
	if a.submit != b.submit {
		return a.submit < b.submit
	}
	return a.seq < b.seq
}

// waitsBefore reports whether a is served before b within their tenant.
func waitsBefore(a, b *waiter) bool {
	ea, eb := waitEntry{submit: a.submit, seq: a.seq}, waitEntry{submit: b.submit, seq: b.seq}
	return ea.before(&eb)
}

func (h *waiterHeap) push(w *waiter) {
	*h = append(*h, waitEntry{submit: w.submit, seq: w.seq, w: w})
	h.up(len(*h) - 1)
}

// pop removes and returns the first waiter (h not empty).
func (h *waiterHeap) pop() *waiter {
	old := *h
	n := len(old) - 1
	w := old[0].w
	old[0] = old[n]
	old[n] = waitEntry{}
	*h = old[:n]
	if n > 0 {
		h.down(0)
	}
	return w
}

// init orders h as a heap.
func (h waiterHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

func (h waiterHeap) up(j int) {
	e := h[j]
	for j > 0 {
		i := (j - 1) / 2
		if !e.before(&h[i]) {
			break
		}
		h[j] = h[i]
		j = i
	}
	h[j] = e
}

func (h waiterHeap) down(i int) {
	n := len(h)
	e := h[i]
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && h[r].before(&h[c]) {
			c = r
		}
		if !h[c].before(&e) {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = e
}

// push links w into the queue.
func (q *waitQueue) push(w *waiter) {
	lv := &q.levels[w.rank]
	if lv.tenants == nil {
		lv.tenants = map[string]*tenantQueue{}
	}
	t := lv.tenants[w.tenant]
	if t == nil {
		t = &tenantQueue{name: w.tenant}
		lv.tenants[w.tenant] = t
	}
	if len(t.h) == 0 {
		// A tenant (re)joining takes its turn after the ones waiting now.
		if lv.next < len(lv.ring) {
			lv.ring = append(lv.ring, nil)
			copy(lv.ring[lv.next+1:], lv.ring[lv.next:])
			lv.ring[lv.next] = t
			lv.next++
		} else {
			lv.ring = append(lv.ring, t)
		}
	}
	t.h.push(w)
	q.links++
}

// pop unlinks and returns the next live waiter, or nil.
func (q *waitQueue) pop() *waiter {
	for r := ranks - 1; r >= 0; r-- {
		lv := &q.levels[r]
		for len(lv.ring) > 0 {
			if lv.next >= len(lv.ring) {
				lv.next = 0
			}
			t := lv.ring[lv.next]
			w := t.h.pop()
			q.links--
			if len(t.h) == 0 {
				lv.ring = append(lv.ring[:lv.next], lv.ring[lv.next+1:]...)
				delete(lv.tenants, t.name)
			} else {
				lv.next++
			}
			if !w.gone {
				return w
			}
		}
	}
	return nil
}

// position is how many live waiters would be served before w: everything
// at higher priority, and at w's priority the turns taken before w's tenant
// reaches w. It walks the queue: an operator's question, not a hot path.
func (q *waitQueue) position(w *waiter) int {
	n := 0
	for r := ranks - 1; r > w.rank; r-- {
		for _, t := range q.levels[r].tenants {
			n += liveIn(t.h)
		}
	}
	lv := &q.levels[w.rank]
	mine := lv.tenants[w.tenant]
	if mine == nil {
		return n
	}
	ahead := 0 // w's place in its own tenant's order
	for _, e := range mine.h {
		o := e.w
		if !o.gone && o != w && !waitsBefore(w, o) {
			ahead++
		}
	}
	n += ahead
	// Every other tenant is served once per round: ahead+1 rounds for w, in
	// the last of which only the tenants whose turn comes before w's.
	myTurn := 0
	for i, t := range lv.ring {
		if t == mine {
			myTurn = (i - lv.next + len(lv.ring)) % len(lv.ring)
		}
	}
	for i, t := range lv.ring {
		if t == mine {
			continue
		}
		turn := (i - lv.next + len(lv.ring)) % len(lv.ring)
		rounds := ahead
		if turn < myTurn {
			rounds++
		}
		n += min(liveIn(t.h), rounds)
	}
	return n
}

func liveIn(h waiterHeap) int {
	n := 0
	for _, e := range h {
		if !e.w.gone {
			n++
		}
	}
	return n
}

// compact drops dead links when they are most of the queue.
func (q *waitQueue) compact() {
	if q.links-q.live < 1024 || q.links-q.live < q.live {
		return
	}
	for r := range q.levels {
		lv := &q.levels[r]
		ring := lv.ring[:0]
		for i, t := range lv.ring {
			keep := t.h[:0]
			for _, e := range t.h {
				if !e.w.gone {
					keep = append(keep, e)
				}
			}
			clear(t.h[len(keep):])
			t.h = keep
			t.h.init()
			if len(t.h) == 0 {
				delete(lv.tenants, t.name)
				if i < lv.next {
					lv.next--
				}
				continue
			}
			ring = append(ring, t)
		}
		clear(lv.ring[len(ring):])
		lv.ring = ring
	}
	q.links = q.live
}
