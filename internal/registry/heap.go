package registry

// index is one placement index: a binary min-heap of the workers that may
// take work, plus counts of the workers held out of it. A pool has one over
// all its workers; each label selector has one over the workers carrying
// its labels. A worker's entry in an index is a dense id local to it.
//
// The heap is hand-written rather than container/heap, and laid out for
// the cache: the pick path sifts one worker through it on every job. Slots
// carry a copy of the sort key and the id, positions live in a dense array
// by id, so a sift reads and writes two compact arrays and never touches a
// Worker (at 10k workers that is the difference between cache hits and a
// miss per level).
type index struct {
	heap       []slot
	pos        []int32   // by id: position in heap, or -1
	byID       []*Worker // by id; nil for a free id
	free       []int32
	overloaded int
	stale      int
	away       int
}

// slot is 16 bytes, four to a cache line. A 32-bit random tie is plenty to
// order equal scores; on the rare equal tie the order is merely fixed.
type slot struct {
	score float64
	tie   uint32
	id    int32
}

func (s *slot) before(o *slot) bool {
	return s.score < o.score || (s.score == o.score && s.tie < o.tie)
}

// member is a worker's entry in one index.
type member struct {
	id int32
	ix *index
}

// add gives w an id in the index, outside the heap and the counters.
func (x *index) add(w *Worker) member {
	var id int32
	if n := len(x.free); n > 0 {
		id = x.free[n-1]
		x.free = x.free[:n-1]
		x.byID[id] = w
		x.pos[id] = -1
	} else {
		id = int32(len(x.byID))
		x.byID = append(x.byID, w)
		x.pos = append(x.pos, -1)
	}
	return member{id: id, ix: x}
}

// release frees an id that has left the heap and the counters.
func (x *index) release(id int32) {
	x.byID[id] = nil
	x.free = append(x.free, id)
}

func (x *index) top() *Worker {
	if len(x.heap) == 0 {
		return nil
	}
	return x.byID[x.heap[0].id]
}

// enter and leave move an entry in or out of the heap or the counters.
func (x *index) enter(id int32, where placement) {
	switch where {
	case placedHeap:
		w := x.byID[id]
		x.pos[id] = int32(len(x.heap))
		x.heap = append(x.heap, slot{score: w.score, tie: w.tie, id: id})
		x.up(len(x.heap) - 1)
	case placedOverloaded:
		x.overloaded++
	case placedStale:
		x.stale++
	case placedAway:
		x.away++
	}
}

func (x *index) leave(id int32, from placement) {
	switch from {
	case placedHeap:
		x.remove(int(x.pos[id]))
	case placedOverloaded:
		x.overloaded--
	case placedStale:
		x.stale--
	case placedAway:
		x.away--
	}
}

// rekey copies the worker's new key into its slot and restores order.
func (x *index) rekey(id int32) {
	i := int(x.pos[id])
	w := x.byID[id]
	x.heap[i].score, x.heap[i].tie = w.score, w.tie
	if !x.down(i) {
		x.up(i)
	}
}

func (x *index) remove(i int) {
	last := len(x.heap) - 1
	id := x.heap[i].id
	if i != last {
		x.swap(i, last)
	}
	x.heap = x.heap[:last]
	x.pos[id] = -1
	if i != last && !x.down(i) {
		x.up(i)
	}
}

func (x *index) up(i int) {
	h := x.heap
	for i > 0 {
		parent := (i - 1) / 2
		if !h[i].before(&h[parent]) {
			return
		}
		x.swap(i, parent)
		i = parent
	}
}

// down sifts i towards the leaves and reports whether it moved.
func (x *index) down(i0 int) bool {
	h := x.heap
	n := len(h)
	i := i0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && h[r].before(&h[l]) {
			c = r
		}
		if !h[c].before(&h[i]) {
			break
		}
		x.swap(i, c)
		i = c
	}
	return i > i0
}

func (x *index) swap(i, j int) {
	h := x.heap
	h[i], h[j] = h[j], h[i]
	x.pos[h[i].id] = int32(i)
	x.pos[h[j].id] = int32(j)
}
