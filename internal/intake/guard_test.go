package intake

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/embedded"
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
		if ok, _ := env.Redis.HExists(ctx, key, field(md)).Result(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the guard never wrote its mark")
		}
	}
	if ttl := env.Redis.PTTL(ctx, key).Val(); ttl < GuardTTL || ttl > GuardTTL+guardHeadroom {
		t.Fatalf("mark TTL %v, want [%v, %v]", ttl, GuardTTL, GuardTTL+guardHeadroom)
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
	// Through the guard, the real ack lands: nothing comes back. The
	// guard acks after its mark is written (asynchronously): wait for the
	// consumer to hold nothing pending, else a loaded machine lets the
	// 300 ms ack wait pass first and JetStream rightly redelivers.
	if err := g.Wrap(again).Ack(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guarded ack never landed: %d pending", info.NumAckPending)
		}
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

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// markAll acks msgs through g and waits (up to 5 s) until the guard has
// acked them all: their marks are written, in batches of their own.
func markAll(t *testing.T, g *Guard, acked *atomic.Int64, msgs ...*fakeMsg) {
	t.Helper()
	want := acked.Load() + int64(len(msgs))
	for _, m := range msgs {
		if err := g.Wrap(m).Ack(); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); acked.Load() < want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d acked", acked.Load(), want)
		}
	}
}

// redelivered is msg as JetStream offers it again: same stream, sequence
// and stored time, one more delivery.
func redelivered(m *fakeMsg) *fakeMsg {
	r := *m
	r.md.NumDelivered = m.md.NumDelivered + 1
	return &r
}

// A redelivered message is recognised whichever batch wrote its mark and
// however long ago it was stored: messages stored on either side of a
// bucket boundary and one stored an hour before (its bucket key long gone),
// marked in one batch, then another batch marking more, are all found.
// Messages never marked are not: a neighbour sequence, the same sequence
// with another stored time (a recreated stream), and no first delivery is
// ever checked.
func TestGuardRecognisesMarksAcrossBucketsAndAges(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	g := NewGuard(env.Redis, env.KeyPrefix(), nil, discard)
	g.Start()
	defer g.Stop()
	var acked atomic.Int64
	msg := func(stream string, seq uint64, stored time.Time) *fakeMsg {
		return &fakeMsg{md: jetstream.MsgMetadata{Stream: stream, Sequence: jetstream.SequencePair{Stream: seq},
			NumDelivered: 1, Timestamp: stored}, acked: &acked}
	}
	boundary := time.Unix(time.Now().Unix()/int64(guardBucket/time.Second)*int64(guardBucket/time.Second), 0)
	before := msg("S", 1, boundary.Add(-time.Nanosecond))
	at := msg("S", 2, boundary)
	end := msg("S", 3, boundary.Add(guardBucket-time.Nanosecond))
	old := msg("S", 4, time.Now().Add(-time.Hour))
	other := msg("R", 2, boundary)
	if g.key(&before.md) == g.key(&at.md) || g.key(&at.md) != g.key(&end.md) || g.key(&at.md) == g.key(&other.md) {
		t.Fatalf("bucket keys: %s %s %s %s", g.key(&before.md), g.key(&at.md), g.key(&end.md), g.key(&other.md))
	}

	markAll(t, g, &acked, before, at, old)
	markAll(t, g, &acked, end, other)

	for _, m := range []*fakeMsg{before, at, end, old, other} {
		if g.Seen(m) {
			t.Fatalf("a first delivery (%s %d) was checked", m.md.Stream, m.md.Sequence.Stream)
		}
		if !g.Seen(redelivered(m)) {
			t.Fatalf("redelivery of %s %d stored %v not recognised", m.md.Stream, m.md.Sequence.Stream, m.md.Timestamp)
		}
		key := g.key(&m.md)
		if ttl := env.Redis.PTTL(ctx, key).Val(); ttl < GuardTTL || ttl > GuardTTL+guardHeadroom {
			t.Fatalf("%s: TTL %v, want [%v, %v]", key, ttl, GuardTTL, GuardTTL+guardHeadroom)
		}
	}
	for _, m := range []*fakeMsg{msg("S", 5, boundary), msg("S", 2, boundary.Add(time.Millisecond)),
		msg("R", 2, boundary.Add(-time.Nanosecond)), msg("S", 4, old.md.Timestamp.Add(guardBucket))} {
		if g.Seen(redelivered(m)) {
			t.Fatalf("redelivery of %s %d stored %v, never marked, taken for handled", m.md.Stream, m.md.Sequence.Stream, m.md.Timestamp)
		}
	}
	var c dto.Metric
	if err := g.Skipped.WithLabelValues("S").Write(&c); err != nil {
		t.Fatal(err)
	}
	if got := c.GetCounter().GetValue(); got != 4 {
		t.Fatalf("skipped counter for S %v, want 4", got)
	}
}

// A bucket key lost under a running guard (FLUSHALL, a Redis restarted
// empty) gets a TTL again from the next write to it, although the guard had
// given it one before; and the guard forgets the keys whose TTL it knows
// once they could not spare an EXPIRE any more.
func TestGuardRestoresTheTTLOfALostKey(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	g := NewGuard(env.Redis, env.KeyPrefix(), nil, discard)
	g.Start()
	defer g.Stop()
	var acked atomic.Int64
	stored := time.Now()
	first := &fakeMsg{md: jetstream.MsgMetadata{Stream: "S", Sequence: jetstream.SequencePair{Stream: 1},
		NumDelivered: 1, Timestamp: stored}, acked: &acked}
	second := &fakeMsg{md: jetstream.MsgMetadata{Stream: "S", Sequence: jetstream.SequencePair{Stream: 2},
		NumDelivered: 1, Timestamp: stored.Add(time.Nanosecond)}, acked: &acked}
	key := g.key(&first.md)
	markAll(t, g, &acked, first)
	if ttl := env.Redis.PTTL(ctx, key).Val(); ttl < GuardTTL {
		t.Fatalf("TTL %v after the first write", ttl)
	}
	if err := env.Redis.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	markAll(t, g, &acked, second)
	if !g.Seen(redelivered(second)) {
		t.Fatal("the mark written after the loss is not found")
	}
	if ttl := env.Redis.PTTL(ctx, key).Val(); ttl < GuardTTL || ttl > GuardTTL+guardHeadroom {
		t.Fatalf("TTL %v after the key was lost and written again, want [%v, %v]", ttl, GuardTTL, GuardTTL+guardHeadroom)
	}

	g.Stop() // the writer's goroutine is done: its map may be read here
	if _, ok := g.lives[key]; !ok {
		t.Fatalf("the guard does not remember %s", key)
	}
	g.prune(time.Now().Add(guardHeadroom))
	if len(g.lives) != 0 {
		t.Fatalf("%d bucket keys remembered after their TTL could no longer spare an EXPIRE", len(g.lives))
	}
}

// When Redis cannot be reached, a redelivered message is handled as usual
// (not taken for handled) and acks still go through.
func TestGuardWithoutRedis(t *testing.T) {
	port, err := embedded.Port("127.0.0.1", 0) // free: nothing listens
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port), MaxRetries: -1})
	defer rdb.Close()
	g := NewGuard(rdb, "x:", nil, discard)
	g.Start()
	defer g.Stop()
	var acked atomic.Int64
	m := &fakeMsg{md: jetstream.MsgMetadata{Stream: "S", Sequence: jetstream.SequencePair{Stream: 1},
		NumDelivered: 2, Timestamp: time.Now()}, acked: &acked}
	if g.Seen(m) {
		t.Fatal("a redelivery was taken for handled with Redis unreachable")
	}
	markAll(t, g, &acked, m)
}
