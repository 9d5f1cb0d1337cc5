package router

import (
	"strconv"
	"testing"
)

// BenchmarkWaitQueue is a capacity wait's work in one pool's queue with
// jobs waiting: a job joins it and the oldest is placed (the bench's jobs
// each wait once, one tenant, one priority).
func BenchmarkWaitQueue(b *testing.B) {
	for _, waiting := range []int{1024, 8192} {
		b.Run("waiting="+strconv.Itoa(waiting), func(b *testing.B) {
			const ring = 1 << 15
			ws := make([]*waiter, ring)
			for i := range ws {
				ws[i] = &waiter{jobID: "job-" + strconv.Itoa(i), tenant: "t", rank: 1}
			}
			var q waitQueue
			seq := uint64(0)
			add := func(w *waiter) {
				seq++
				w.seq, w.submit, w.gone = seq, int64(seq/4), false // submits share milliseconds
				q.push(w)
				q.live++
			}
			for i := 0; i < waiting; i++ {
				add(ws[i])
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				add(ws[(i+waiting)%ring])
				w := q.pop()
				if w == nil {
					b.Fatal("empty")
				}
				w.gone = true
				q.live--
			}
		})
	}
}

// TestWaitQueueServesOldestFirst: within a tenant and a priority the queue
// places the oldest submit first, ties by arrival, and skips dead links.
func TestWaitQueueServesOldestFirst(t *testing.T) {
	var q waitQueue
	submits := []int64{50, 10, 30, 10, 70, 20, 30, 0, 90, 60, 40, 10}
	var ws []*waiter
	for i, s := range submits {
		w := &waiter{jobID: "j" + strconv.Itoa(i), tenant: "t", rank: 1, submit: s, seq: uint64(i + 1)}
		ws = append(ws, w)
		q.push(w)
		q.live++
	}
	ws[4].gone = true // placed through another pool
	q.live--
	var got []string
	for w := q.pop(); w != nil; w = q.pop() {
		got = append(got, w.jobID)
		q.live--
	}
	want := "j7 j1 j3 j11 j5 j2 j6 j10 j0 j9 j8"
	if s := joinIDs(got); s != want {
		t.Fatalf("order %s, want %s", s, want)
	}
}

func joinIDs(ids []string) string {
	s := ""
	for i, id := range ids {
		if i > 0 {
			s += " "
		}
		s += id
	}
	return s
}
