package troupe_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// A node alone hears no result subject: every result reaches it through
// the shared result consumer, once, and is handled there (no copy held for
// a settle that a second copy would bring). A replica appearing makes both
// hear the subject, so results reach their owners without forwards; once
// the replica is gone (silent for the router's PeerTTL), the node stops
// hearing it again. Every job runs once and ends once throughout.
func TestALoneNodeHearsTheResultSubjectOnlyWithReplicas(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	a := f.node
	const heard = "troupe_results_subject_heard"
	waitGauge(t, a, heard, 0)

	rec := newReceipts()
	defer startEchoWorkers(t, f, 2, rec)()
	waitLive(t, a, 2)
	run := func(prefix string, jobs int) {
		t.Helper()
		for i := 0; i < jobs; i++ {
			f.submit(echoReq(fmt.Sprintf("%s-%d", prefix, i)))
		}
		for i := 0; i < jobs; i++ {
			r := f.waitState(fmt.Sprintf("%s-%d", prefix, i), jobstate.StateSucceeded)
			if n := rec.count(r.ID); n != 1 {
				t.Fatalf("%s received %d times", r.ID, n)
			}
		}
	}
	run("alone", 50)
	if got := counter(t, a, heard, ""); got != 0 {
		t.Fatalf("a node alone hears the result subject (%s = %v)", heard, got)
	}
	if held := counter(t, a, "troupe_results_shared_copies_total", "owner") +
		counter(t, a, "troupe_results_shared_copies_total", "handled"); held != 0 {
		t.Fatalf("a node alone held %v shared copies for a settle no second copy brings", held)
	}

	b := newNodeOn(t, f, "node-b")
	f.node = a // the fixture submits and reads through a, which outlives b
	waitGauge(t, a, heard, 1)
	waitGauge(t, b, heard, 1)
	waitLive(t, b, 2)
	run("pair", 60)

	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Forgotten after the router's PeerTTL (3 s) of silence, checked each
	// sweep.
	waitGauge(t, a, heard, 0)
	run("alone-again", 30)
}
