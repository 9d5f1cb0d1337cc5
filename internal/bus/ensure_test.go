package bus_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/testenv"
)

// Three replicas starting at the same moment against a fresh stream prefix
// each create the streams and consumers; a creator that loses the race
// (JetStream answers "subjects overlap with an existing stream", or "name
// already in use") takes the stream the winner made. Twenty rounds, three
// connections each (issue 27, item 9): none fails.
func TestEnsureStreamsToleratesConcurrentCreators(t *testing.T) {
	env := testenv.New(t)
	const rounds, replicas = 20, 3
	conns := make([]jetstream.JetStream, replicas)
	for i := range conns {
		nc, err := nats.Connect(env.NATSURL, nats.Name(fmt.Sprintf("%s-%d", t.Name(), i)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		if conns[i], err = jetstream.New(nc); err != nil {
			t.Fatal(err)
		}
	}
	failures := 0
	for round := range rounds {
		prefix := fmt.Sprintf("%s_R%d", env.StreamPrefix(), round)
		subj := bus.NewSubjects(fmt.Sprintf("%s.r%d", env.Prefix, round))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := make(chan struct{})
		errs := make([]error, replicas)
		var wg sync.WaitGroup
		for i, js := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = bus.EnsureReplicatedStreams(ctx, js, prefix, subj, 1)
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				failures++
				t.Errorf("round %d, replica %d: %v", round, i, err)
			}
		}
		for _, kind := range []bus.StreamKind{bus.StreamSubmit, bus.StreamResult, bus.StreamCancel} {
			name := bus.StreamName(prefix, kind)
			if _, err := conns[0].Consumer(ctx, name, bus.ConsumerName(kind)); err != nil {
				t.Errorf("round %d: %s has no consumer: %v", round, name, err)
			}
			_ = conns[0].DeleteStream(ctx, name)
		}
		cancel()
	}
	t.Logf("%d rounds of %d concurrent creators: %d failed", rounds, replicas, failures)
}

// The losing creator's side of the race, made certain: while another
// stream still holds the subjects, JetStream answers "subjects overlap with
// an existing stream"; the winner's stream then appears (here: the
// stand-in is deleted and the real one created, as the winner's create
// landing). EnsureStreams reads the stream again and takes it.
func TestEnsureStreamsTakesTheWinnersStream(t *testing.T) {
	env := testenv.NewWithPrivateNATS(t)
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subj := bus.NewSubjects(env.Prefix)
	prefix := env.StreamPrefix()
	submit := bus.StreamName(prefix, bus.StreamSubmit)
	standIn := prefix + "_STANDIN"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: standIn, Subjects: []string{subj.Submit},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	lost := 0
	bus.SetOnConcurrentCreate(func(name string) {
		if name != submit {
			return
		}
		lost++
		if lost > 1 {
			return
		}
		if err := js.DeleteStream(ctx, standIn); err != nil {
			t.Error(err)
		}
		// The winner: the same settings EnsureStreams asks for.
		if err := bus.EnsureStreams(ctx, js, prefix, subj); err != nil {
			t.Error(err)
		}
	})
	t.Cleanup(func() { bus.SetOnConcurrentCreate(nil) })
	if err := bus.EnsureStreams(ctx, js, prefix, subj); err != nil {
		t.Fatalf("the loser of the creation race failed: %v", err)
	}
	if lost == 0 {
		t.Fatal("the create never met the overlap; the test proves nothing")
	}
	if _, err := js.Consumer(ctx, submit, bus.ConsumerName(bus.StreamSubmit)); err != nil {
		t.Fatal(err)
	}
}

// A stream of another name that keeps the subjects is a real conflict:
// EnsureStreams fails with JetStream's error instead of waiting for ever.
func TestEnsureStreamsFailsOnAForeignOverlap(t *testing.T) {
	env := testenv.NewWithPrivateNATS(t)
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subj := bus.NewSubjects(env.Prefix)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: env.StreamPrefix() + "_FOREIGN",
		Subjects: []string{subj.Submit}}); err != nil {
		t.Fatal(err)
	}
	err = bus.EnsureStreams(ctx, js, env.StreamPrefix(), subj)
	if err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Fatalf("EnsureStreams = %v, want the subjects-overlap error", err)
	}
}

// A result stream made with interest retention (a build of 2026-11-26 read
// it through a consumer per node; JetStream cannot change a stream's
// retention) is kept as it is: EnsureStreams takes it, with the shared
// consumer, instead of failing the node's start.
func TestEnsureStreamsKeepsAnInterestResultStream(t *testing.T) {
	env := testenv.NewWithPrivateNATS(t)
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subj := bus.NewSubjects(env.Prefix)
	prefix := env.StreamPrefix()
	if err := bus.EnsureStreams(ctx, js, prefix, subj); err != nil {
		t.Fatal(err)
	}
	name := bus.StreamName(prefix, bus.StreamResult)
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if err := js.DeleteStream(ctx, name); err != nil {
		t.Fatal(err)
	}
	cfg.Retention = jetstream.InterestPolicy
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, js, prefix, subj); err != nil {
		t.Fatalf("an interest-retention result stream failed the start: %v", err)
	}
	st, err = js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Retention; r != jetstream.InterestPolicy {
		t.Fatalf("retention %v, want the stream kept as it was (interest)", r)
	}
	if _, err := js.Consumer(ctx, name, bus.ConsumerName(bus.StreamResult)); err != nil {
		t.Fatalf("shared result consumer: %v", err)
	}
}
