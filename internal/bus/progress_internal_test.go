package bus

import (
	"testing"
	"time"
)

// The progress keeper's schedule on its own clock: an unsettled message is
// due first after its fetch, then every interval, until maxAge from its
// fetch; a settled one is never due again; nothing is due early.
func TestProgressKeeperSchedule(t *testing.T) {
	k := newProgressKeeper(nil, 2*time.Second, 4*time.Second, 11*time.Second) // its own schedule, not the defaults
	t0 := time.Unix(1_000_000, 0)
	batch := []progressState{{reply: "r1"}, {reply: "r2"}}
	held, acked := &batch[0], &batch[1]
	k.add(t0, batch)
	at := func(d time.Duration) []*progressState { return k.due(t0.Add(d), nil) }
	if got := at(1999 * time.Millisecond); len(got) != 0 {
		t.Fatalf("due before KeepFirst: %d", len(got))
	}
	acked.settled.Store(true)
	if got := at(2 * time.Second); len(got) != 1 || got[0] != held {
		t.Fatalf("at 2 s: %v, want the held message alone", got)
	}
	if got := at(5 * time.Second); len(got) != 0 {
		t.Fatalf("due at 5 s, 3 s after its touch: %d", len(got))
	}
	if got := at(6 * time.Second); len(got) != 1 {
		t.Fatalf("at 6 s: %d due, want 1", len(got))
	}
	if got := at(10 * time.Second); len(got) != 1 {
		t.Fatalf("at 10 s: %d due, want 1", len(got))
	}
	// Past maxAge (11 s): given up, and the keeper holds nothing.
	if got := at(14 * time.Second); len(got) != 0 {
		t.Fatalf("at 14 s, past maxAge: %d due", len(got))
	}
	if n := k.kept(); n != 0 {
		t.Fatalf("keeper holds %d after every message left", n)
	}
	// Settled between touches: dropped at its next turn.
	later := []progressState{{reply: "r3"}}
	m := &later[0]
	k.add(t0.Add(20*time.Second), later)
	if got := at(22 * time.Second); len(got) != 1 {
		t.Fatalf("at 22 s: %d due, want 1", len(got))
	}
	m.settled.Store(true)
	if got := at(26 * time.Second); len(got) != 0 || k.kept() != 0 {
		t.Fatalf("settled message still due (%d) or kept (%d)", len(got), k.kept())
	}
}

// Bursts handed over out of order (two fetch loops) are kept in order of
// their clocks: an earlier one is due at its own time, not held back.
func TestProgressKeeperOrdersBursts(t *testing.T) {
	k := newProgressKeeper(nil, 2*time.Second, 4*time.Second, time.Minute)
	t0 := time.Unix(1_000_000, 0)
	late := []progressState{{reply: "late"}}
	early := []progressState{{reply: "early"}}
	k.add(t0.Add(time.Second), late)
	k.add(t0, early)
	if got := k.due(t0.Add(2*time.Second), nil); len(got) != 1 || got[0].reply != "early" {
		t.Fatalf("at 2 s: %d due, want the early burst's message", len(got))
	}
	if got := k.due(t0.Add(3*time.Second), nil); len(got) != 1 || got[0].reply != "late" {
		t.Fatalf("at 3 s: %d due, want the late burst's message", len(got))
	}
}
