package bus_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/testenv"
)

// keeperFixture is a keeper over freshly made streams on a private NATS
// server, with a clock the test moves and every callback recorded.
type keeperFixture struct {
	js     jetstream.JetStream
	subj   bus.Subjects
	prefix string
	k      *bus.StreamKeeper

	mu        sync.Mutex
	now       time.Time
	recreated []string
	resets    []string
	probes    []error
}

func newKeeperFixture(t *testing.T) *keeperFixture {
	t.Helper()
	env := testenv.NewWithPrivateNATS(t)
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	f := &keeperFixture{js: js, subj: bus.NewSubjects(env.Prefix), prefix: env.StreamPrefix(), now: time.Unix(1_000_000, 0)}
	if err := bus.EnsureStreams(context.Background(), js, f.prefix, f.subj); err != nil {
		t.Fatal(err)
	}
	f.k = bus.NewStreamKeeper(js, f.prefix, f.subj, 1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	f.k.SetNow(func() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now })
	f.k.OnRecreated = func(_ bus.StreamKind, name, part string) {
		f.mu.Lock()
		f.recreated = append(f.recreated, name+" "+part)
		f.mu.Unlock()
	}
	f.k.OnReset = func(_ bus.StreamKind, name string) {
		f.mu.Lock()
		f.resets = append(f.resets, name)
		f.mu.Unlock()
	}
	f.k.OnProbe = func(kind bus.StreamKind, _ string, err error) {
		if kind != bus.StreamResult {
			return
		}
		f.mu.Lock()
		f.probes = append(f.probes, err)
		f.mu.Unlock()
	}
	f.check(t) // learns the streams and probes them
	return f
}

func (f *keeperFixture) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func (f *keeperFixture) check(t *testing.T) {
	t.Helper()
	if err := f.k.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (f *keeperFixture) exists(t *testing.T, name string) bool {
	t.Helper()
	_, err := f.js.Stream(context.Background(), name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// A deleted stream is recreated only once it has stayed gone for the
// settle time (nats-server removes a deleted stream's files after it
// stops finding it: one recreated in that window refuses every write), and
// the new stream is probed before it counts.
func TestStreamKeeperRecreatesOnlyOnceTheStreamStayedGone(t *testing.T) {
	f := newKeeperFixture(t)
	f.k.Settle = 10 * time.Second
	name := bus.StreamName(f.prefix, bus.StreamResult)
	if err := f.js.DeleteStream(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	f.check(t)
	f.advance(9 * time.Second)
	f.check(t)
	if f.exists(t, name) {
		t.Fatal("stream recreated before it had stayed gone for the settle time")
	}
	f.advance(time.Second)
	f.check(t)
	if !f.exists(t, name) {
		t.Fatal("stream not recreated once it had stayed gone for the settle time")
	}
	if _, err := f.js.Consumer(context.Background(), name, bus.ConsumerName(bus.StreamResult)); err != nil {
		t.Fatalf("consumer not recreated with its stream: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.recreated) != 1 || f.recreated[0] != name+" "+bus.PartStream {
		t.Fatalf("recreated %v, want [%s stream]", f.recreated, name)
	}
	if len(f.resets) != 1 {
		t.Fatalf("resets %v, want one", f.resets)
	}
	// The first check's probe, then the new stream's.
	if len(f.probes) != 2 || f.probes[1] != nil {
		t.Fatalf("probes of the result stream %v, want two accepted", f.probes)
	}
	if err := f.k.Refusing(); err != nil {
		t.Fatal(err)
	}
}

// The same for a consumer deleted from its stream.
func TestStreamKeeperRecreatesAConsumerOnlyOnceItStayedGone(t *testing.T) {
	f := newKeeperFixture(t)
	f.k.Settle = 10 * time.Second
	ctx := context.Background()
	name := bus.StreamName(f.prefix, bus.StreamSubmit)
	consumer := bus.ConsumerName(bus.StreamSubmit)
	if err := f.js.DeleteConsumer(ctx, name, consumer); err != nil {
		t.Fatal(err)
	}
	f.check(t)
	f.advance(5 * time.Second)
	f.check(t)
	if _, err := f.js.Consumer(ctx, name, consumer); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("consumer recreated before it had stayed gone (err %v)", err)
	}
	f.advance(5 * time.Second)
	f.check(t)
	if _, err := f.js.Consumer(ctx, name, consumer); err != nil {
		t.Fatalf("consumer not recreated: %v", err)
	}
}

// brokenStream replaces kind's stream with one that refuses every write
// with a store failure (err_code 10077), as a stream recreated while
// nats-server still deleted the old one does ("error opening msg block
// file"); here a byte limit smaller than any message, with new messages
// discarded, makes the same answer on any server. It holds msgs messages.
func brokenStream(t *testing.T, f *keeperFixture, kind bus.StreamKind, subject string, msgs int) string {
	t.Helper()
	ctx := context.Background()
	name := bus.StreamName(f.prefix, kind)
	if err := f.js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{subject, f.subj.Probe(kind)},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage}
	if _, err := f.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for range msgs {
		if _, err := f.js.Publish(ctx, subject, []byte("held")); err != nil {
			t.Fatal(err)
		}
	}
	cfg.MaxBytes, cfg.Discard = 1, jetstream.DiscardNew
	if _, err := f.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(ctx, subject, []byte("x")); err == nil {
		t.Fatal("the broken stand-in took a write")
	}
	return name
}

// A stream that exists but refuses writes is found by the probe that
// follows every new stream, reported (OnProbe, Refusing), and repaired:
// deleted, recreated once it has stayed gone, and probed again. The
// repair makes a new stream, so OnReset tells the node (the results the
// refusing stream turned away are asked again).
func TestStreamKeeperRepairsAStreamThatRefusesWrites(t *testing.T) {
	f := newKeeperFixture(t)
	f.k.Settle = 10 * time.Second
	name := brokenStream(t, f, bus.StreamResult, f.subj.Result, 0)
	f.check(t) // a new stream: probed, refused, deleted
	err := f.k.Refusing()
	if err == nil || !strings.Contains(err.Error(), name) {
		t.Fatalf("Refusing() = %v, want the result stream named", err)
	}
	if f.exists(t, name) {
		t.Fatal("the refusing stream was not deleted for repair")
	}
	f.advance(5 * time.Second)
	f.check(t)
	if f.exists(t, name) {
		t.Fatal("the refusing stream was recreated before it had stayed gone")
	}
	f.advance(5 * time.Second)
	f.check(t)
	if err := f.k.Refusing(); err != nil {
		t.Fatalf("after the repair: %v", err)
	}
	if _, err := f.js.Publish(context.Background(), f.subj.Result, []byte("after")); err != nil {
		t.Fatalf("the repaired stream refuses a write: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.probes); n != 3 || f.probes[1] == nil || f.probes[2] != nil {
		t.Fatalf("probes %v, want accepted, refused, accepted", f.probes)
	}
	if len(f.resets) != 2 {
		t.Fatalf("resets %v, want two (the broken stream, the repaired one)", f.resets)
	}
}

// A refusing stream that still holds messages is not deleted (that would
// lose them): it stays reported, and is probed again at every check.
func TestStreamKeeperReportsARefusingStreamWithMessages(t *testing.T) {
	f := newKeeperFixture(t)
	f.k.Settle = -1
	name := brokenStream(t, f, bus.StreamSubmit, f.subj.Submit, 1)
	f.check(t)
	f.check(t)
	if err := f.k.Refusing(); err == nil || !strings.Contains(err.Error(), name) {
		t.Fatalf("Refusing() = %v, want the submit stream named", err)
	}
	st, err := f.js.Stream(context.Background(), name)
	if err != nil {
		t.Fatalf("the refusing stream holding a message was deleted: %v", err)
	}
	if st.CachedInfo().State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want its 1", st.CachedInfo().State.Msgs)
	}
}

// A probe message is acked by Consume and never handed to the handler.
func TestConsumeSkipsProbes(t *testing.T) {
	f := newKeeperFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan string, 10)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := bus.Consume(ctx, f.js, f.prefix, bus.StreamResult, log, func(m jetstream.Msg) {
		_ = m.Ack()
		got <- string(m.Data())
	}, nil); err != nil {
		t.Fatal(err)
	}
	probe := &nats.Msg{Subject: f.subj.Probe(bus.StreamResult), Header: nats.Header{bus.ProbeHeader: []string{"1"}}}
	if _, err := f.js.PublishMsg(ctx, probe); err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(ctx, f.subj.Result, []byte("real")); err != nil {
		t.Fatal(err)
	}
	if m := <-got; m != "real" {
		t.Fatalf("handled %q, want only the real message", m)
	}
	name := bus.StreamName(f.prefix, bus.StreamResult)
	cons, err := f.js.Consumer(ctx, name, bus.ConsumerName(bus.StreamResult))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if time.Now().After(deadline) {
			t.Fatal("the probe was never acked")
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case m := <-got:
		t.Fatalf("handled %q", m)
	default:
	}
}

// A stream whose limits an operator changes after its last probe (here:
// a byte limit no message fits, with a message held so that it is reported,
// not repaired) is probed at the next check, not at the next ProbeEvery: a
// probe made just before the change proved nothing.
func TestStreamKeeperProbesAStreamWhoseLimitsChanged(t *testing.T) {
	f := newKeeperFixture(t)
	f.k.ProbeEvery = time.Hour
	ctx := context.Background()
	name := bus.StreamName(f.prefix, bus.StreamSubmit)
	if _, err := f.js.Publish(ctx, f.subj.Submit, []byte("held")); err != nil {
		t.Fatal(err)
	}
	f.check(t)
	if err := f.k.Refusing(); err != nil {
		t.Fatalf("before the change: %v", err)
	}
	st, err := f.js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxBytes, cfg.Discard = 1, jetstream.DiscardNew
	if _, err := f.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	f.advance(time.Second)
	f.check(t)
	if err := f.k.Refusing(); err == nil || !strings.Contains(err.Error(), name) {
		t.Fatalf("Refusing() = %v after the limit change, want the submit stream named", err)
	}
}
