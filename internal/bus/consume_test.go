package bus_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/testenv"
)

// Consume keeps FetchLoops pulls waiting at the server for each stream, so
// that one fetch nats.go fails to see end (it then waits about a second
// more) does not hold back the messages that arrive meanwhile: the server
// hands them to the other pull. Every message is handled once.
func TestConsumeKeepsSeveralPullsWaiting(t *testing.T) {
	ctx, js, prefix, subj := streamsOnPrivateNATS(t)
	got := make(chan string, 100)
	handle := func(m jetstream.Msg) {
		_ = m.Ack()
		got <- string(m.Data())
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := bus.Consume(ctx, js, prefix, bus.StreamResult, log, handle, nil); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, bus.StreamName(prefix, bus.StreamResult), bus.ConsumerName(bus.StreamResult))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, err := cons.Info(ctx)
		if err == nil && info.NumWaiting >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pulls waiting at the server: %+v (err %v), want 2 (bus.FetchLoops = %d)", info, err, bus.FetchLoops)
		}
		time.Sleep(10 * time.Millisecond)
	}
	seen := map[string]int{}
	for i := 0; i < 50; i++ {
		if _, err := js.Publish(ctx, subj.Result, []byte{byte('a' + i%26), byte('0' + i/26)}); err != nil {
			t.Fatal(err)
		}
	}
	for len(seen) < 50 {
		select {
		case m := <-got:
			seen[m]++
			if seen[m] > 1 {
				t.Fatalf("message %q handled twice", m)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of 50 messages handled", len(seen))
		}
	}
}

// A fetch asks for no more than the room FetchRoom reports, split between
// the loops: with room for 4 and 50 messages waiting, the two loops take
// 2 each, and then, the room gone, nothing more.
func TestConsumeFetchesNoMoreThanTheRoom(t *testing.T) {
	ctx, js, prefix, subj := streamsOnPrivateNATS(t)
	for i := 0; i < 50; i++ {
		if _, err := js.Publish(ctx, subj.Result, []byte{byte('a' + i%26), byte('0' + i/26)}); err != nil {
			t.Fatal(err)
		}
	}
	var taken, asked atomic.Int32
	room := func() int {
		asked.Add(1)
		if taken.Load() > 0 {
			return 0 // what was fetched is being handled: no room now
		}
		return 4
	}
	handle := func(m jetstream.Msg) {
		taken.Add(1)
		_ = m.Ack()
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := bus.Consume(ctx, js, prefix, bus.StreamResult, log, handle, nil, bus.FetchRoom(room)); err != nil {
		t.Fatal(err)
	}
	// Once the loops have asked for room many times more, they hold.
	for deadline := time.Now().Add(30 * time.Second); asked.Load() < 40 || taken.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("room asked %d times, %d messages taken", asked.Load(), taken.Load())
		}
	}
	if n := taken.Load(); n > 4 {
		t.Fatalf("%d messages taken with room for 4", n)
	}
}

// Consume's messages are JetStream's: their metadata counts deliveries, a
// delayed nak has the server deliver the message again, and an ack
// settles it (none left pending).
func TestConsumeMessagesAckNakAndCountDeliveries(t *testing.T) {
	ctx, js, prefix, subj := streamsOnPrivateNATS(t)
	const n = 20
	for i := 0; i < n; i++ {
		if _, err := js.Publish(ctx, subj.Result, []byte{byte('a' + i)}); err != nil {
			t.Fatal(err)
		}
	}
	type delivery struct {
		data  string
		count uint64
		seq   uint64
	}
	got := make(chan delivery, 4*n)
	handle := func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil {
			t.Errorf("metadata: %v", err)
			return
		}
		if md.NumDelivered == 1 {
			_ = m.NakWithDelay(10 * time.Millisecond)
		} else {
			_ = m.Ack()
		}
		got <- delivery{string(m.Data()), md.NumDelivered, md.Sequence.Stream}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := bus.Consume(ctx, js, prefix, bus.StreamResult, log, handle, nil); err != nil {
		t.Fatal(err)
	}
	seen := map[string][]uint64{}
	for acked := 0; acked < n; {
		select {
		case d := <-got:
			if d.seq < 1 || d.seq > n {
				t.Fatalf("message %q with stream sequence %d", d.data, d.seq)
			}
			seen[d.data] = append(seen[d.data], d.count)
			if d.count > 1 {
				acked++
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d messages acked; deliveries %v", acked, n, seen)
		}
	}
	for data, counts := range seen {
		if len(counts) != 2 || counts[0] != 1 || counts[1] != 2 {
			t.Fatalf("message %q delivered with counts %v, want [1 2]", data, counts)
		}
	}
	cons, err := js.Consumer(ctx, bus.StreamName(prefix, bus.StreamResult), bus.ConsumerName(bus.StreamResult))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		info, err := cons.Info(ctx)
		if err == nil && info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer after every ack: %+v (err %v), want nothing pending", info, err)
		}
	}
}

// streamsOnPrivateNATS starts a NATS server of the test's own with
// Troupe's streams made in it; the context ends with the test.
func streamsOnPrivateNATS(t *testing.T) (context.Context, jetstream.JetStream, string, bus.Subjects) {
	t.Helper()
	env := testenv.NewWithPrivateNATS(t)
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	subj := bus.NewSubjects(env.Prefix)
	prefix := env.StreamPrefix()
	if err := bus.EnsureStreams(ctx, js, prefix, subj); err != nil {
		t.Fatal(err)
	}
	return ctx, js, prefix, subj
}
