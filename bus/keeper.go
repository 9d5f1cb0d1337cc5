package bus

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamCheckEvery is how often a StreamKeeper looks for missing streams
// and consumers when no fetch loop has asked it to. A fetch on a deleted
// consumer fails once ("consumer deleted") and then only times out, so the
// periodic check, not the fetch error, is what always finds a lost stream.
const StreamCheckEvery = 3 * time.Second

// streamCheckGap is the least time between two checks (fetch loops may ask
// for one on every failure).
const streamCheckGap = 250 * time.Millisecond

// Parts a StreamKeeper recreates.
const (
	PartStream   = "stream"
	PartConsumer = "consumer"
)

// StreamKeeper recreates, while a node runs, the work-queue streams and
// durable consumers EnsureReplicatedStreams made at its start: a stream
// deleted by an operator, or lost with a JetStream store, would otherwise
// stop submits (clients get no stream ack) or results (workers retry, then
// give up) until every node restarted. The messages a lost stream held are
// gone; what the keeper restores is the flow from then on.
type StreamKeeper struct {
	js       jetstream.JetStream
	prefix   string
	subj     Subjects
	replicas int
	log      *slog.Logger
	// OnRecreated, when set, is called for every stream or consumer the
	// keeper recreated (part is PartStream or PartConsumer), after its WARN
	// line.
	OnRecreated func(kind StreamKind, name, part string)
	// OnReset, when set, is called once for each stream found to be a new
	// one since the keeper's previous check — recreated by this keeper or
	// by anyone else (another replica's keeper, an operator, a NATS server
	// that lost its JetStream store): the messages the old one held are
	// gone. A stream's creation time tells one stream from the next.
	OnReset func(kind StreamKind, name string)
	// Every is the periodic check's interval (default StreamCheckEvery).
	Every time.Duration

	kick chan struct{}

	mu      sync.Mutex
	created map[StreamKind]time.Time // each stream's creation time, as last seen
}

// NewStreamKeeper returns a keeper of the streams EnsureReplicatedStreams
// makes with the same arguments; Run it.
func NewStreamKeeper(js jetstream.JetStream, prefix string, subj Subjects, replicas int, log *slog.Logger) *StreamKeeper {
	return &StreamKeeper{js: js, prefix: prefix, subj: subj, replicas: replicas, log: log,
		kick: make(chan struct{}, 1), created: map[StreamKind]time.Time{}}
}

// Kick asks for a check soon (a fetch failed); it never blocks.
func (k *StreamKeeper) Kick() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// Run checks at once (learning the streams' creation times), then every
// Every and when kicked, until ctx ends.
func (k *StreamKeeper) Run(ctx context.Context) {
	every := k.Every
	if every <= 0 {
		every = StreamCheckEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-k.kick:
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := k.Check(cctx); err != nil && ctx.Err() == nil {
			k.log.Debug("stream check failed", "err", err)
		}
		cancel()
		sleep(ctx, streamCheckGap)
	}
}

// Check recreates each missing stream (with its consumer) and each missing
// consumer of a present stream. It returns the first error other than
// "not found" (NATS unreachable, JetStream unavailable): nothing is
// recreated on a guess.
func (k *StreamKeeper) Check(ctx context.Context) error {
	var first error
	for kind, subject := range streamSubjects(k.subj) {
		if err := k.check(ctx, kind, subject); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (k *StreamKeeper) check(ctx context.Context, kind StreamKind, subject string) error {
	name := StreamName(k.prefix, kind)
	st, err := k.js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		st, err = k.js.CreateStream(ctx, streamConfig(name, subject, k.replicas))
		mine := err == nil
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			k.log.Error("stream missing and not recreated; its inputs are refused", "stream", name, "err", err)
			return err
		}
		if _, err := k.js.CreateOrUpdateConsumer(ctx, name, consumerConfig(kind)); err != nil {
			k.log.Error("stream recreated without its consumer", "stream", name, "err", err)
			return err
		}
		if mine {
			k.recreated(kind, name, PartStream)
			k.seen(kind, name, st.CachedInfo().Created, true)
		}
		return nil
	case err != nil:
		return err
	}
	k.seen(kind, name, st.CachedInfo().Created, false)
	_, err = k.js.Consumer(ctx, name, ConsumerName(kind))
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if _, err := k.js.CreateConsumer(ctx, name, consumerConfig(kind)); err != nil {
			if errors.Is(err, jetstream.ErrConsumerExists) {
				return nil // another replica was first
			}
			k.log.Error("consumer missing and not recreated", "stream", name, "consumer", ConsumerName(kind), "err", err)
			return err
		}
		k.recreated(kind, name, PartConsumer)
		return nil
	case err != nil:
		return err
	}
	return nil
}

// seen records the stream's creation time and reports a new stream (logged
// unless quiet: this keeper has just said it recreated it).
func (k *StreamKeeper) seen(kind StreamKind, name string, created time.Time, quiet bool) {
	k.mu.Lock()
	prev, known := k.created[kind]
	k.created[kind] = created
	k.mu.Unlock()
	if !known || prev.IsZero() || prev.Equal(created) {
		return
	}
	if !quiet {
		k.log.Warn("stream is a new one since the last check (recreated elsewhere); the messages the old one held are lost",
			"stream", name, "created", created)
	}
	if k.OnReset != nil {
		k.OnReset(kind, name)
	}
}

func (k *StreamKeeper) recreated(kind StreamKind, name, part string) {
	if part == PartStream {
		k.log.Warn("stream was missing; recreated (messages it held are lost)", "stream", name)
	} else {
		k.log.Warn("consumer was missing; recreated", "stream", name, "consumer", ConsumerName(kind))
	}
	if k.OnRecreated != nil {
		k.OnRecreated(kind, name, part)
	}
}
