package router

import (
	"container/heap"
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

type waiterHeap []*waiter

func (h waiterHeap) Len() int { return len(h) }
func (h waiterHeap) Less(i, j int) bool {
	if h[i].submit != h[j].submit {
		return h[i].submit < h[j].submit
	}
	return h[i].seq < h[j].seq
}
func (h waiterHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *waiterHeap) Push(x any)   { *h = append(*h, x.(*waiter)) }
func (h *waiterHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return w
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
	heap.Push(&t.h, w)
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
			w := heap.Pop(&t.h).(*waiter)
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
	for _, o := range mine.h {
		if !o.gone && o != w && !waiterHeap([]*waiter{w, o}).Less(0, 1) {
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
	for _, w := range h {
		if !w.gone {
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
			for _, w := range t.h {
				if !w.gone {
					keep = append(keep, w)
				}
			}
			clear(t.h[len(keep):])
			t.h = keep
			heap.Init(&t.h)
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
