package jobactor_test

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/lifecycle"
)

func TestBackoffDoublesWithJitterAndCaps(t *testing.T) {
	t.Parallel()
	for attempt := 0; attempt < 60; attempt++ {
		base := jobactor.BackoffCap
		if attempt < 5 {
			base = min(jobactor.BackoffBase<<attempt, jobactor.BackoffCap)
		}
		for i := 0; i < 50; i++ {
			d := jobactor.Backoff(attempt)
			if d < base || d > jobactor.BackoffCap || d >= base+500*time.Millisecond {
				t.Fatalf("attempt %d: %v outside [%v, min(%v+500ms, cap))", attempt, d, base, base)
			}
		}
	}
	// Jitter really varies.
	seen := map[time.Duration]bool{}
	for i := 0; i < 20; i++ {
		seen[jobactor.Backoff(1)] = true
	}
	if len(seen) < 10 {
		t.Fatalf("jitter produced only %d distinct delays in 20 draws", len(seen))
	}
}

type wakeCounter struct{ got chan struct{} }

func (w *wakeCounter) Receive(c actor.Context) {
	if _, ok := c.Message().(*actor.Started); ok {
		return
	}
	switch c.Message().(type) {
	case *actor.Stopping, *actor.Stopped:
		return
	}
	w.got <- struct{}{}
}

func TestWheelFiresInOrderAndCancelRemoves(t *testing.T) {
	t.Parallel()
	sys := actor.NewActorSystem()
	w := jobactor.NewWheel(sys.Root)
	defer w.Stop()
	sink := &wakeCounter{got: make(chan struct{}, 10)}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink }))
	start := time.Now()
	w.Schedule(80*time.Millisecond, pid, 1)
	cancelled := w.Schedule(40*time.Millisecond, pid, 2)
	far := w.Schedule(time.Hour, pid, 3) // beyond one rotation
	w.Cancel(cancelled)
	w.Cancel(cancelled) // twice is harmless
	if w.Len() != 2 {
		t.Fatalf("len %d, want 2", w.Len())
	}
	select {
	case <-sink.got:
		if el := time.Since(start); el < 80*time.Millisecond {
			t.Fatalf("fired after %v, before its time", el)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("entry never fired")
	}
	select {
	case <-sink.got:
		t.Fatal("cancelled or far entry fired")
	case <-time.After(150 * time.Millisecond):
	}
	w.Cancel(far)
	if w.Len() != 0 {
		t.Fatalf("len %d after cancelling everything", w.Len())
	}
}

// An idle wheel (no entries) does not tick — an idle node is not woken 100
// times a second — and an entry scheduled after an idle spell fires on
// time.
func TestIdleWheelStopsTickingAndResumes(t *testing.T) {
	t.Parallel()
	sys := actor.NewActorSystem()
	w := jobactor.NewWheel(sys.Root)
	defer w.Stop()
	sink := &wakeCounter{got: make(chan struct{}, 10)}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink }))
	for round := 0; round < 2; round++ {
		before := w.Ticks()
		time.Sleep(100 * time.Millisecond) // ten ticks' worth, idle
		if n := w.Ticks() - before; n > 1 {
			t.Fatalf("round %d: %d ticks while idle, want none (one may be in progress)", round, n)
		}
		start := time.Now()
		w.Schedule(30*time.Millisecond, pid, uint64(round))
		select {
		case <-sink.got:
			if el := time.Since(start); el < 30*time.Millisecond {
				t.Fatalf("round %d: fired after %v, before its time", round, el)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: entry scheduled after an idle spell never fired", round)
		}
	}
}

func TestParseTimeouts(t *testing.T) {
	t.Parallel()
	tm, err := jobactor.ParseTimeouts([]byte("reconciler:\n  dispatch_timeout_seconds: 60\ntopics:\n  job.slow:\n    timeout_seconds: 36000\n"))
	if err != nil {
		t.Fatal(err)
	}
	if tm.Dispatch != time.Minute || tm.Running != jobactor.RunningTimeoutDefault ||
		tm.RunningFor("job.slow") != 10*time.Hour || tm.RunningFor("job.other") != jobactor.RunningTimeoutDefault {
		t.Fatalf("%+v", tm)
	}
	if _, err := jobactor.ParseTimeouts([]byte("reconciler:\n  dispatch_timeout: 5\n")); err == nil {
		t.Fatal("unknown key accepted")
	}
	if _, err := jobactor.ParseTimeouts([]byte("topics:\n  job.x:\n    timeout_seconds: 0\n")); err == nil {
		t.Fatal("zero topic timeout accepted")
	}
}

type timerSink struct{ got chan uint64 }

func (s *timerSink) Receive(c actor.Context) {
	if m, ok := c.Message().(*lifecycle.Timer); ok {
		s.got <- m.Epoch
	}
}

// A job actor keeps one wheel entry: Reschedule moves it (scheduled or
// fired) to its new time and epoch, so only the last epoch fires and the
// wheel holds one entry for it.
func TestWheelRescheduleMovesTheOneEntry(t *testing.T) {
	t.Parallel()
	sys := actor.NewActorSystem()
	w := jobactor.NewWheel(sys.Root)
	defer w.Stop()
	sink := &timerSink{got: make(chan uint64, 10)}
	pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return sink }))
	e := w.Schedule(time.Hour, pid, 1)
	if again := w.Reschedule(e, 20*time.Millisecond, pid, 2); again != e {
		t.Fatal("Reschedule allocated a new entry for a scheduled one")
	}
	if w.Len() != 1 {
		t.Fatalf("len %d after moving the one entry, want 1", w.Len())
	}
	for _, want := range []uint64{2, 3} {
		select {
		case got := <-sink.got:
			if got != want {
				t.Fatalf("fired epoch %d, want %d (a moved entry fired at its old epoch)", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("epoch %d never fired", want)
		}
		if w.Len() != 0 {
			t.Fatalf("len %d after the entry fired", w.Len())
		}
		// Fired: the same entry is scheduled again.
		if again := w.Reschedule(e, 20*time.Millisecond, pid, want+1); again != e {
			t.Fatal("Reschedule allocated a new entry for a fired one")
		}
	}
	w.Cancel(e)
	if w.Len() != 0 {
		t.Fatalf("len %d after cancelling", w.Len())
	}
}

// A released entry (a stopped actor's) never fires for its old owner, and
// the next Schedule takes it for its own timer, which fires with its own
// epoch to its own PID.
func TestWheelReleasedEntryServesTheNextTimerOnly(t *testing.T) {
	t.Parallel()
	sys := actor.NewActorSystem()
	w := jobactor.NewWheel(sys.Root)
	defer w.Stop()
	old := &timerSink{got: make(chan uint64, 10)}
	next := &timerSink{got: make(chan uint64, 10)}
	oldPID := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return old }))
	nextPID := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return next }))
	e := w.Schedule(20*time.Millisecond, oldPID, 1)
	w.Release(e)
	if w.Len() != 0 {
		t.Fatalf("len %d after releasing the one entry, want 0", w.Len())
	}
	if got := w.Schedule(20*time.Millisecond, nextPID, 7); got != e {
		t.Fatal("Schedule allocated a new entry with a released one kept")
	}
	select {
	case got := <-next.got:
		if got != 7 {
			t.Fatalf("fired epoch %d, want 7", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the reused entry never fired")
	}
	// The old owner's wake, had it come, was sent before this one (same
	// slot, earlier tick); none came.
	select {
	case got := <-old.got:
		t.Fatalf("the released entry fired for its old owner (epoch %d)", got)
	default:
	}
	w.Release(nil) // a no-op
}
