package store

import (
	"testing"
	"time"
)

// gatherWriter is a Writer with no goroutines and no Redis: the test calls
// collect itself and plays the pipelines in flight (inFlight, landed).
// Each wait that gather begins or resumes is sent on the returned channel.
func gatherWriter(t *testing.T, level int32, inFlight int32) (*Writer, <-chan struct{}) {
	t.Helper()
	old := gatherFor
	gatherFor = time.Hour // a wait that ends by its timer fails the test's deadline
	t.Cleanup(func() { gatherFor = old })
	waits := make(chan struct{}, 16)
	w := &Writer{ops: make(chan *Op, 1024), maxBatch: WriterMaxBatchDefault, landed: make(chan struct{}, WriterConcurrencyDefault),
		waiting: func() { waits <- struct{}{} }}
	w.level.Store(level)
	w.inFlight.Store(inFlight)
	return w, waits
}

// collected runs collect and returns its batch on a channel.
func collected(w *Writer) <-chan []*Op {
	out := make(chan []*Op, 1)
	go func() {
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		b, _ := w.collect(nil, timer)
		out <- b
	}()
	return out
}

// waited waits for collect to begin or resume a wait, failing if it sends
// its batch instead.
func waited(t *testing.T, waits <-chan struct{}, out <-chan []*Op) {
	t.Helper()
	select {
	case <-waits:
	case b := <-out:
		t.Fatalf("sent a batch of %d ops, did not wait", len(b))
	case <-time.After(30 * time.Second):
		t.Fatal("collect neither waits nor sends")
	}
}

func await(t *testing.T, out <-chan []*Op) []*Op {
	t.Helper()
	select {
	case b := <-out:
		return b
	case <-time.After(30 * time.Second):
		t.Fatal("collect still waits")
		return nil
	}
}

// At a low rate (the batches' level under gatherFrom) an op goes at once,
// another pipeline in flight or not: nothing waits for it to land.
func TestWriterSendsAtOnceWhileBatchesAreSmall(t *testing.T) {
	w, waits := gatherWriter(t, gatherFrom-1, 2)
	w.ops <- &Op{JobID: "a"}
	if b := await(t, collected(w)); len(b) != 1 {
		t.Fatalf("batch of %d ops, want the 1 queued", len(b))
	}
	if len(waits) > 0 {
		t.Fatal("waited")
	}
	if w.level.Load() >= gatherFrom {
		t.Fatalf("level %d after a batch of 1", w.level.Load())
	}
}

// While the batches are full and a pipeline is in flight, the taker waits
// for the pipelines in flight to land and then takes every op queued
// meanwhile: one batch, not one per op.
func TestWriterGathersWhilePipelinesAreInFlight(t *testing.T) {
	w, waits := gatherWriter(t, gatherTo, 2)
	w.ops <- &Op{JobID: "first"}
	out := collected(w)
	waited(t, waits, out)
	for i := range 9 {
		w.ops <- &Op{JobID: string(rune('a' + i))}
	}
	// One pipeline lands: another is still in flight, so it waits on.
	w.inFlight.Add(-1)
	w.landed <- struct{}{}
	waited(t, waits, out)
	w.ops <- &Op{JobID: "late"}
	w.inFlight.Add(-1)
	w.landed <- struct{}{}
	if b := await(t, out); len(b) != 11 || b[0].JobID != "first" || b[10].JobID != "late" {
		t.Fatalf("batch of %d ops, want the 11 queued in order", len(b))
	}
}

// A taker that finds gatherTo ops queued at a landing sends them without
// waiting for the other pipelines.
func TestWriterGathersNoMoreThanGatherTo(t *testing.T) {
	w, waits := gatherWriter(t, gatherTo, 3)
	w.ops <- &Op{JobID: "first"}
	out := collected(w)
	waited(t, waits, out)
	for range gatherTo {
		w.ops <- &Op{}
	}
	w.inFlight.Add(-1)
	w.landed <- struct{}{}
	if b := await(t, out); len(b) != gatherTo+1 {
		t.Fatalf("batch of %d ops, want %d", len(b), gatherTo+1)
	}
}
