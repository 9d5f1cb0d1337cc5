package bus_test

import (
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
)

// progressRedelivery is the submit consumer's redelivery wait in these
// tests (bus.RedeliveryBackoff[0] is 5 s): the handler holds its messages
// three times as long.
const progressRedelivery = 600 * time.Millisecond

// heldSubmits publishes n submits to a submit stream whose consumer
// redelivers after progressRedelivery, consumes them with opts through a
// handler that holds every message un-acked until the hold ends, then
// acks them all. It returns how many times each was handled and the
// consumer's info while they were held.
func heldSubmits(t *testing.T, n int, hold time.Duration, opts ...bus.ConsumeOption) (map[string]int, *jetstream.ConsumerInfo) {
	t.Helper()
	ctx, js, prefix, subj := streamsOnPrivateNATS(t)
	stream := bus.StreamName(prefix, bus.StreamSubmit)
	cfg := bus.ConsumerConfig(bus.StreamSubmit)
	cfg.BackOff = []time.Duration{progressRedelivery}
	if err := js.DeleteConsumer(ctx, stream, cfg.Durable); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, stream, cfg); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen = map[string]int{}
		held []jetstream.Msg
	)
	all := make(chan struct{})
	handle := func(m jetstream.Msg) {
		mu.Lock()
		defer mu.Unlock()
		seen[string(m.Data())]++
		held = append(held, m)
		if len(seen) == n && len(held) == n {
			close(all)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := bus.Consume(ctx, js, prefix, bus.StreamSubmit, log, handle, nil, opts...); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := js.Publish(ctx, subj.Submit, []byte{'s', byte('a' + i%26), byte('a' + i/26)}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-all:
	case <-time.After(5 * time.Second):
		t.Fatalf("not every submit handled within 5 s")
	}
	// The node's backlog: every submit held un-acked, well past the
	// consumer's redelivery wait.
	time.Sleep(hold)
	cons, err := js.Consumer(ctx, stream, cfg.Durable)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for _, m := range held {
		_ = m.Ack()
	}
	out := make(map[string]int, len(seen))
	for k, v := range seen {
		out[k] = v
	}
	mu.Unlock()
	return out, info
}

// A fetch loop that keeps its messages in progress (KeepInProgress) holds
// them un-acked for three redelivery waits and JetStream offers none of
// them again: each is handled once, and the consumer counts no redelivery.
func TestConsumeKeepsHeldSubmitsInProgress(t *testing.T) {
	t.Parallel()
	var touches atomic.Uint64
	seen, info := heldSubmits(t, 40, 3*progressRedelivery,
		bus.KeepInProgressEvery(time.Minute, progressRedelivery/3, progressRedelivery/2, &touches))
	for m, k := range seen {
		if k != 1 {
			t.Fatalf("submit %q handled %d times, want once", m, k)
		}
	}
	if len(seen) != 40 {
		t.Fatalf("%d submits handled, want 40", len(seen))
	}
	if info.NumRedelivered != 0 || info.NumAckPending != 40 {
		t.Fatalf("consumer while held: %d redelivered, %d pending; want 0 and 40", info.NumRedelivered, info.NumAckPending)
	}
	if touches.Load() < 40 {
		t.Fatalf("%d in-progress signals, want one per held submit at least", touches.Load())
	}
}

// Without the keeper the same hold has JetStream offer the submits again:
// the test above measures something.
func TestConsumeWithoutKeeperRedeliversHeldSubmits(t *testing.T) {
	t.Parallel()
	seen, info := heldSubmits(t, 40, 3*progressRedelivery)
	twice := 0
	for _, k := range seen {
		if k > 1 {
			twice++
		}
	}
	if twice == 0 && info.NumRedelivered == 0 {
		t.Fatalf("no submit offered again after %v held un-acked (redelivery wait %v)", 3*progressRedelivery, progressRedelivery)
	}
}

// A settled message is no longer kept: acked at once, nothing is touched.
func TestConsumeKeeperTouchesNoSettledMessage(t *testing.T) {
	t.Parallel()
	ctx, js, prefix, subj := streamsOnPrivateNATS(t)
	var touches atomic.Uint64
	got := make(chan struct{}, 20)
	handle := func(m jetstream.Msg) { _ = m.Ack(); got <- struct{}{} }
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := bus.Consume(ctx, js, prefix, bus.StreamSubmit, log, handle, nil,
		bus.KeepInProgressEvery(time.Minute, 50*time.Millisecond, 100*time.Millisecond, &touches)); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := js.Publish(ctx, subj.Submit, []byte{'k', byte('a' + i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of 20 handled", i)
		}
	}
	// Several first-touch and touch intervals go by.
	time.Sleep(400 * time.Millisecond)
	if n := touches.Load(); n != 0 {
		t.Fatalf("%d in-progress signals for acked messages", n)
	}
}

// While KeepWhile says false (the node's lock renewals are late) the keeper
// touches nothing: the held submits go back to JetStream's redelivery, for
// a replica, as with no keeper.
func TestConsumeKeeperLetsGoWhileTheNodeCannotKeepUp(t *testing.T) {
	t.Parallel()
	var touches atomic.Uint64
	seen, info := heldSubmits(t, 40, 3*progressRedelivery,
		bus.KeepInProgressEvery(time.Minute, progressRedelivery/3, progressRedelivery/2, &touches),
		bus.KeepWhile(func() bool { return false }))
	twice := 0
	for _, k := range seen {
		if k > 1 {
			twice++
		}
	}
	if twice == 0 && info.NumRedelivered == 0 {
		t.Fatalf("no submit offered again while the keeper may not touch")
	}
	if n := touches.Load(); n != 0 {
		t.Fatalf("%d in-progress signals sent while the keeper may not touch", n)
	}
}

// A message that arrives alone is kept in a state of its own, not in a
// block sized for the whole fetch: at a low rate each job's submit would
// otherwise hold 32 states (768 bytes) while its job lives (a 200,000-job
// hold at 2,500/s peaked ~45-65 MiB higher so).
func TestProgressKeeperHoldsOneStateForAMessageAlone(t *testing.T) {
	t.Parallel()
	ctx, js, prefix, subj := streamsOnPrivateNATS(t)
	handled := make(chan struct{}, 8)
	handle := func(m jetstream.Msg) { _ = m.Ack(); handled <- struct{}{} }
	var slots func() int64
	if err := bus.Consume(ctx, js, prefix, bus.StreamSubmit, slog.New(slog.NewTextHandler(io.Discard, nil)), handle, nil,
		bus.KeepInProgress(time.Minute, nil), bus.KeeperSlots(&slots)); err != nil {
		t.Fatal(err)
	}
	const n = 5
	for i := 0; i < n; i++ {
		if _, err := js.Publish(ctx, subj.Submit, []byte("alone")); err != nil {
			t.Fatal(err)
		}
		select { // the next only once this one was handled: each arrives alone
		case <-handled:
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d not handled", i)
		}
	}
	// The pull hands its states over when it would wait: by the time the
	// fifth was handled the first four were; the fifth follows when its
	// pull next waits.
	deadline := time.Now().Add(5 * time.Second)
	for slots == nil || slots() < n {
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if slots == nil {
		t.Fatal("Consume made no keeper")
	}
	if got := slots(); got != n {
		t.Fatalf("%d states' room for %d messages that each arrived alone, want %d", got, n, n)
	}
}
