package intake

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// Bad input is dead-lettered once: a rejected packet is marked handled
// like any other, so when its ack is lost and JetStream offers it again,
// the guard acks it unhandled instead of writing a second DLQ entry.
func TestRejectedPacketIsDeadLetteredOnceWhenOfferedAgain(t *testing.T) {
	env := testenv.New(t)
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stream := env.StreamPrefix() + "_REJECT"
	subject := env.Prefix + ".reject.submit"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject},
		Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "r",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 300 * time.Millisecond, MaxDeliver: 5})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st := store.New(env.Redis, store.Config{Prefix: env.Prefix + ":"})
	g := NewGuard(env.Redis, env.Prefix+":", nil, log)
	g.Start()
	defer g.Stop()
	in := &Intake{Store: st, Guard: g, Log: log, Env: &jobactor.Env{NodeID: "n1", Log: log,
		Subjects: bus.NewSubjects(env.Prefix), Publish: func(string, []byte) error { return nil }}}

	if _, err := js.Publish(ctx, subject, []byte{0xff, 0xff, 0xff}); err != nil { // not a packet
		t.Fatal(err)
	}
	first := fetchOne(t, cons)
	lost := &markedAck{Msg: first, marked: make(chan struct{})}
	in.HandleSubmit(lost)
	// The guard acks only once its mark is written (the ack itself is lost):
	// the redelivery is handled after that, as it would be with a real
	// ack wait, not in the 300 ms this test's consumer allows.
	select {
	case <-lost.marked:
	case <-time.After(10 * time.Second):
		t.Fatal("the rejected packet's guard mark was never written")
	}
	again := fetchOne(t, cons) // offered again after the ack wait
	if md, _ := again.Metadata(); md.NumDelivered != 2 {
		t.Fatalf("second offer has NumDelivered %d, want 2", md.NumDelivered)
	}
	in.HandleSubmit(again)
	es, err := st.ListDLQ(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range es {
		if e.Reason == jobstate.ReasonDecodeFailed && e.Subject == subject {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d DLQ entries for one bad packet offered twice, want 1", n)
	}
}

// markedAck is a delivery whose ack is lost, closing marked when it is
// called: the guard calls it once it has written the message's mark.
type markedAck struct {
	jetstream.Msg
	marked chan struct{}
}

func (m *markedAck) Ack() error { close(m.marked); return nil }
