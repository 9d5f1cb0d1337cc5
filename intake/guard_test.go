package intake

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/troupe-run/troupe/internal/testenv"
)

// lostAck is a message whose ack never reaches the server: the node died
// after the guard's mark was written and before the ack left.
type lostAck struct{ jetstream.Msg }

func (lostAck) Ack() error { return nil }

// fetchOne fetches one message from cons, waiting up to 10 s.
func fetchOne(t *testing.T, cons jetstream.Consumer) jetstream.Msg {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			return m
		}
	}
	t.Fatal("no message within 10 s")
	return nil
}

// A message handled (its mark written) but never acked comes back from
// JetStream, and the guard recognises it; a message that was never handled
// does not look handled, on its first delivery or on a redelivery.
func TestGuardRecognisesAMessageHandledButNotAcked(t *testing.T) {
	env := testenv.New(t)
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream := env.StreamPrefix() + "_GUARD"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{env.Prefix + ".guard.>"},
		Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "g",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 300 * time.Millisecond, MaxDeliver: 5})
	if err != nil {
		t.Fatal(err)
	}
	g := NewGuard(env.Redis, env.Prefix+":", nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	g.Start()
	defer g.Stop()

	if _, err := js.Publish(ctx, env.Prefix+".guard.a", []byte("handled")); err != nil {
		t.Fatal(err)
	}
	first := fetchOne(t, cons)
	if g.Seen(first) {
		t.Fatal("a first delivery was taken for handled")
	}
	// Handle it: the guarded ack marks it, but the ack itself is lost.
	if err := (&GuardedMsg{Msg: lostAck{first}, g: g}).Ack(); err != nil {
		t.Fatal(err)
	}
	md, _ := first.Metadata()
	key := g.key(md)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, _ := env.Redis.Exists(ctx, key).Result(); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the guard never wrote its mark")
		}
	}
	if ttl := env.Redis.PTTL(ctx, key).Val(); ttl <= 0 || ttl > GuardTTL {
		t.Fatalf("mark TTL %v, want (0, %v]", ttl, GuardTTL)
	}

	again := fetchOne(t, cons) // redelivered after the ack wait
	if md, _ := again.Metadata(); md.NumDelivered < 2 {
		t.Fatalf("expected a redelivery, got delivery %d", md.NumDelivered)
	}
	if !g.Seen(again) {
		t.Fatal("the redelivered message was not recognised as handled")
	}
	var m dto.Metric
	if err := g.Skipped.WithLabelValues(stream).Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 1 {
		t.Fatalf("skipped counter %v, want 1", got)
	}
	// Through the guard, the real ack lands: nothing comes back.
	if err := g.Wrap(again).Ack(); err != nil {
		t.Fatal(err)
	}

	// A message that was never handled is redelivered and handled.
	if _, err := js.Publish(ctx, env.Prefix+".guard.b", []byte("not handled")); err != nil {
		t.Fatal(err)
	}
	unhandled := fetchOne(t, cons)
	if string(unhandled.Data()) != "not handled" {
		t.Fatalf("the acked message came back: %q", unhandled.Data())
	}
	redelivered := fetchOne(t, cons)
	if string(redelivered.Data()) != "not handled" {
		t.Fatalf("got %q", redelivered.Data())
	}
	if g.Seen(redelivered) {
		t.Fatal("a redelivered message that was never handled was taken for handled")
	}
	_ = g.Wrap(redelivered).Ack()
}

// Stop acks every message whose mark was queued before it.
func TestGuardStopAcksWhatWasQueued(t *testing.T) {
	env := testenv.New(t)
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream := env.StreamPrefix() + "_GUARD2"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{env.Prefix + ".guard2.>"},
		Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "g",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	for i := 0; i < n; i++ {
		if _, err := js.Publish(ctx, env.Prefix+".guard2.x", []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	g := NewGuard(env.Redis, env.Prefix+":", nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	g.Start()
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range batch.Messages() {
		_ = g.Wrap(m).Ack()
		got++
	}
	g.Stop()
	if got != n {
		t.Fatalf("fetched %d of %d", got, n)
	}
	// Acks are async on the server side; wait (bounded) for the stream to
	// empty: a work-queue stream drops acked messages.
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still unacked after Stop", info.State.Msgs)
		}
	}
}
