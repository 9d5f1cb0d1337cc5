package troupe_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/bus"
	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/worker"
)

// The processed-message guard must not take a message of a recreated
// stream for one it handled before: the new stream's sequences start at 1
// again. Results of a first batch of jobs are handled (and marked); the
// RESULT stream is deleted and recreated; a second batch's results get the
// same sequences. The test takes a share of their first deliveries and
// never acks them (a node that died holding them), so JetStream offers
// them again to the running node: each must be handled.
func TestGuardSurvivesARecreatedStream(t *testing.T) {
	t.Parallel()
	// The test recreates the stream itself (as an operator would); the
	// node's own recreation is TestFaultStreamDeletedWhileRunning's.
	f := newFixtureIn(t, testenv.NewWithPrivateNATS(t), func(c *troupe.Config) { c.StreamCheck = -1 })
	f.startWorker("w1", true, nil, worker.Echo)
	ctx := context.Background()
	resultStream := bus.StreamName(f.env.StreamPrefix(), bus.StreamResult)
	consumer := bus.ConsumerName(bus.StreamResult)

	const n = 40
	for i := 0; i < n; i++ {
		f.submit(echoReq(fmt.Sprintf("before-%d", i)))
	}
	for i := 0; i < n; i++ {
		f.waitState(fmt.Sprintf("before-%d", i), core.StateSucceeded)
	}
	waitNoPending(t, f.js, resultStream, consumer) // every result acked: marked 1..n

	if err := f.js.DeleteStream(ctx, resultStream); err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, f.js, f.env.StreamPrefix(), f.subj); err != nil {
		t.Fatal(err)
	}
	cons, err := f.js.Consumer(ctx, resultStream, consumer)
	if err != nil {
		t.Fatal(err)
	}
	// The pull is open before the results exist, so it competes with the
	// node's for their first deliveries; it closes before any redelivery
	// (5 s after the first) could reach it.
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		f.submit(echoReq(fmt.Sprintf("after-%d", i)))
	}
	stolen := 0
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if md.Sequence.Stream > n {
			t.Fatalf("sequence %d: the recreated stream's sequences should repeat 1..%d", md.Sequence.Stream, n)
		}
		stolen++ // never acked
	}
	if stolen == 0 {
		t.Fatal("the test's pull got no first delivery; nothing was redelivered")
	}
	t.Logf("%d of %d results redelivered to the node", stolen, n)
	for i := 0; i < n; i++ {
		f.waitStateWithin(fmt.Sprintf("after-%d", i), core.StateSucceeded, 30*time.Second)
	}
	if got := counter(t, f.node, "troupe_redeliveries_skipped_total", resultStream); got != 0 {
		t.Fatalf("the guard skipped %v redelivered results of the recreated stream", got)
	}
}

// A running node recreates its RESULT and SUBMIT streams when they are
// deleted under it (an operator's mistake, a lost JetStream store): it
// counts each, and jobs submitted afterwards run to the end.
func TestFaultStreamDeletedWhileRunning(t *testing.T) {
	t.Parallel()
	f := newFixtureIn(t, testenv.NewWithPrivateNATS(t), nil)
	f.startWorker("w1", true, nil, worker.Echo)
	ctx := context.Background()
	f.submit(echoReq("before"))
	f.waitState("before", core.StateSucceeded)

	names := map[bus.StreamKind]string{}
	deleted := time.Now()
	for _, kind := range []bus.StreamKind{bus.StreamResult, bus.StreamSubmit} {
		names[kind] = bus.StreamName(f.env.StreamPrefix(), kind)
		if err := f.js.DeleteStream(ctx, names[kind]); err != nil {
			t.Fatal(err)
		}
	}
	// The node finds both missing (a fetch fails, or its periodic check)
	// and recreates them.
	deadline := time.Now().Add(3 * bus.StreamCheckEvery)
	for _, name := range names {
		for counter(t, f.node, "troupe_streams_recreated_total", name) < 1 {
			if time.Now().After(deadline) {
				t.Fatalf("stream %s not recreated within %v", name, 3*bus.StreamCheckEvery)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	recreated := time.Since(deleted)
	if err := f.node.Ready(ctx); err != nil {
		t.Fatalf("not ready after the streams were recreated: %v", err)
	}

	const n = 50
	for i := 0; i < n; i++ {
		f.submit(echoReq(fmt.Sprintf("after-%d", i)))
	}
	for i := 0; i < n; i++ {
		f.waitStateWithin(fmt.Sprintf("after-%d", i), core.StateSucceeded, 20*time.Second)
	}
	for kind, name := range names {
		if got := counter(t, f.node, "troupe_streams_recreated_total", name); got != 1 {
			t.Fatalf("%s recreated %v times, want 1", name, got)
		}
		waitNoPending(t, f.js, name, bus.ConsumerName(kind))
	}
	t.Logf("both streams recreated %v after their deletion; %d jobs submitted then all SUCCEEDED", recreated.Round(time.Millisecond), n)
}
