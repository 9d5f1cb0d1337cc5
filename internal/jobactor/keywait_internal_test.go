package jobactor

import (
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/lifecycle"
)

// keyBacks is an actor that reports each KeyBack it receives.
type keyBacks struct{ got chan struct{} }

func (k *keyBacks) Receive(c actor.Context) {
	if _, ok := c.Message().(*lifecycle.KeyBack); ok {
		k.got <- struct{}{}
	}
}

func spawnKeyBacks(sys *actor.ActorSystem) (*actor.PID, chan struct{}) {
	kb := &keyBacks{got: make(chan struct{}, 10)}
	return sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return kb })), kb.got
}

func woke(t *testing.T, got chan struct{}, want bool, what string) {
	t.Helper()
	select {
	case <-got:
		if !want {
			t.Fatalf("%s: woken", what)
		}
	case <-time.After(200 * time.Millisecond):
		if want {
			t.Fatalf("%s: not woken", what)
		}
	}
}

// A slot handed to a job by name wakes that job, not the key's oldest
// waiter; handed to a job still asking, it wakes the job once its WaitKey
// puts it back in line; a notice naming no job skips jobs still asking;
// the recheck wakes a job handed a slot 2 s ago and still in line (its
// wake was lost) even while the key's notices keep coming.
func TestConcurrencyKeyHandOffWakesTheNamedJob(t *testing.T) {
	t.Parallel()
	sys := actor.NewActorSystem()
	w := NewKeyWaiters()
	oldPID, oldGot := spawnKeyBacks(sys)
	namedPID, namedGot := spawnKeyBacks(sys)
	askPID, askGot := spawnKeyBacks(sys)
	w.add("k", "old", oldPID)
	w.add("k", "named", namedPID)
	if !w.Grant(sys.Root, "k", "named") {
		t.Fatal("the named job is this node's")
	}
	woke(t, namedGot, true, "the named job")
	woke(t, oldGot, false, "the oldest waiter, not named")
	if w.Grant(sys.Root, "k", "elsewhere") {
		t.Fatal("a job of another node counted as this node's")
	}
	// Named while asking: woken only once back in line.
	w.asking("k", "asker", askPID)
	w.Grant(sys.Root, "k", "asker")
	woke(t, askGot, false, "a job still asking")
	if !w.add("k", "asker", askPID) {
		t.Fatal("back in line after being handed a slot: add says not handed")
	}
	// A plain notice: the oldest not woken, never one asking.
	w.asking("k", "asker2", askPID)
	if !w.Wake(sys.Root, "k") {
		t.Fatal("no waiter woken by a plain notice")
	}
	woke(t, oldGot, true, "the oldest waiter on a plain notice")
	if jobs, keys := w.Len(); jobs != 3 || keys != 1 {
		t.Fatalf("Len %d jobs on %d keys; want 3 (the job asking left out) on 1", jobs, keys)
	}
	// The recheck: "named" was handed its slot over 2 s ago and is still in
	// line; a notice for the key came just now, so the key's oldest other
	// waiter is not woken, but the named job is.
	w.remove("k", "asker")
	w.remove("k", "asker2")
	w.mu.Lock()
	w.keys["k"].waiters["named"].grantAt = time.Now().Add(-3 * time.Second)
	w.keys["k"].lastWake = time.Now()
	w.mu.Unlock()
	pids := w.idle(time.Now())
	if len(pids) != 1 || pids[0] != namedPID {
		t.Fatalf("recheck woke %v, want only the job handed a slot (%v)", pids, namedPID)
	}
}
