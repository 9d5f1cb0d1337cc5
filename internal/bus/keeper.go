package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// StreamCheckEvery is how often a StreamKeeper looks for missing streams
// and consumers when no fetch loop has asked it to. A fetch on a deleted
// consumer fails once ("consumer deleted") and then only times out, so the
// periodic check, not the fetch error, is what always finds a lost stream.
const StreamCheckEvery = 3 * time.Second

// RecreateSettleDefault is how long a stream or consumer must have been
// seen missing before a StreamKeeper recreates it. nats-server (2.9) takes a
// stream out of its lookup before it has removed the stream's files: a
// stream recreated within that window gets its message block deleted under
// it and refuses every publish ("error opening msg block file", err_code
// 10077) until it is deleted again. Recreated 2 ms after the delete call
// returned, it was sound in every run; a second is ample.
const RecreateSettleDefault = time.Second

// ProbeEveryDefault is how often a keeper proves, with a probe publish, that
// each stream still accepts writes when nothing else asked for a probe (a
// probe also follows every new stream and every refusal).
const ProbeEveryDefault = 30 * time.Second

// ProbeHeader marks a keeper's probe message; Consume acks it unread.
const ProbeHeader = "Troupe-Probe"

// jsErrStreamStoreFailed is JetStream's answer when it cannot store a
// message ("error opening msg block file", a full disk): the stream is
// there, and refuses writes.
const jsErrStreamStoreFailed jetstream.ErrorCode = 10077

// streamCheckGap is the least time between two checks (fetch loops may ask
// for one on every failure).
const streamCheckGap = 250 * time.Millisecond

// Parts a StreamKeeper recreates.
const (
	PartStream   = "stream"
	PartConsumer = "consumer"
)

// IsProbe reports whether msg is a keeper's probe (see ProbeHeader).
func IsProbe(msg jetstream.Msg) bool {
	h := msg.Headers()
	return h != nil && h.Get(ProbeHeader) != ""
}

// StreamKeeper recreates, while a node runs, the work-queue streams and
// durable consumers EnsureReplicatedStreams made at its start: a stream
// deleted by an operator, or lost with a JetStream store, would otherwise
// stop submits (clients get no stream ack) or results (workers retry, then
// give up) until every node restarted. The messages a lost stream held are
// gone; what the keeper restores is the flow from then on.
//
// It recreates a stream or consumer only once the old one has stayed gone
// for Settle, and proves each stream takes writes with a probe publish (on
// Subjects.Probe, acked, then deleted) at its first check, after every new
// stream, and every ProbeEvery. A stream that refuses the probe is reported
// (WARN, OnProbe, Refusing) and, when it is empty and refuses with a store
// failure, repaired: deleted, recreated once it has stayed gone for Settle,
// and probed again.
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
	// OnProbe, when set, is called after every probe: err is JetStream's
	// refusal, nil when the stream took the probe.
	OnProbe func(kind StreamKind, name string, err error)
	// Every is the periodic check's interval (default StreamCheckEvery).
	Every time.Duration
	// Settle is how long a stream or consumer must have been missing before
	// it is recreated (default RecreateSettleDefault; negative: at once).
	Settle time.Duration
	// ProbeEvery is the interval of probes nothing else asked for (default
	// ProbeEveryDefault).
	ProbeEvery time.Duration
	// MaxBytes is a recreated stream's bound (StreamSettings.MaxBytes; 0:
	// StreamMaxBytes).
	MaxBytes int64

	kick chan struct{}
	now  func() time.Time

	mu       sync.Mutex
	created  map[StreamKind]time.Time // each stream's creation time, as last seen
	missing  map[string]time.Time     // stream or "stream/consumer" → first seen missing
	refusing map[StreamKind]error     // the last probe's refusal
	probed   map[StreamKind]time.Time // the last probe's time
	limits   map[StreamKind]string    // each stream's write limits, as last seen
	due      time.Time                // a missing part's settle ends: check then
	back     chan struct{}            // closed (and replaced) when a part is back
}

// Back returns a channel closed the next time the keeper has recreated a
// stream or consumer, or seen a refusing stream accept writes again (see
// ResumeOn).
func (k *StreamKeeper) Back() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.back
}

func (k *StreamKeeper) signalBack() {
	k.mu.Lock()
	close(k.back)
	k.back = make(chan struct{})
	k.mu.Unlock()
}

// NewStreamKeeper returns a keeper of the streams EnsureReplicatedStreams
// makes with the same arguments; Run it.
func NewStreamKeeper(js jetstream.JetStream, prefix string, subj Subjects, replicas int, log *slog.Logger) *StreamKeeper {
	return &StreamKeeper{js: js, prefix: prefix, subj: subj, replicas: replicas, log: log,
		kick: make(chan struct{}, 1), now: time.Now, created: map[StreamKind]time.Time{},
		missing: map[string]time.Time{}, refusing: map[StreamKind]error{}, probed: map[StreamKind]time.Time{},
		limits: map[StreamKind]string{}, back: make(chan struct{})}
}

// Kick asks for a check soon (a fetch failed); it never blocks.
func (k *StreamKeeper) Kick() {
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// Refusing returns an error naming every stream whose last probe was
// refused, nil when none was.
func (k *StreamKeeper) Refusing() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.refusing) == 0 {
		return nil
	}
	parts := make([]string, 0, len(k.refusing))
	for kind, err := range k.refusing {
		parts = append(parts, fmt.Sprintf("stream %s refuses writes: %v", StreamName(k.prefix, kind), err))
	}
	sort.Strings(parts)
	return errors.New(strings.Join(parts, "; "))
}

func (k *StreamKeeper) settle() time.Duration {
	switch {
	case k.Settle < 0:
		return 0
	case k.Settle == 0:
		return RecreateSettleDefault
	}
	return k.Settle
}

// Run checks at once (learning the streams' creation times and probing
// them), then every Every, when kicked, and when a missing part's settle
// ends, until ctx ends.
func (k *StreamKeeper) Run(ctx context.Context) {
	every := k.Every
	if every <= 0 {
		every = StreamCheckEvery
	}
	for first := true; ; first = false {
		if !first {
			wait := every
			k.mu.Lock()
			if !k.due.IsZero() {
				wait = min(wait, max(k.due.Sub(k.now()), 0))
			}
			k.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-k.kick:
				t.Stop()
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := k.Check(cctx); err != nil && ctx.Err() == nil {
			k.log.Debug("stream check failed", "err", err)
		}
		cancel()
		sleep(ctx, streamCheckGap)
	}
}

// Check recreates each stream (with its consumer) and each consumer of a
// present stream that has been missing for Settle, probes the streams that
// are due a probe, and repairs one that refuses writes. It returns the
// first error other than "not found" (NATS unreachable, JetStream
// unavailable): nothing is recreated on a guess.
func (k *StreamKeeper) Check(ctx context.Context) error {
	k.mu.Lock()
	k.due = time.Time{}
	k.mu.Unlock()
	var first error
	for kind, subject := range streamSubjects(k.subj) {
		if err := k.check(ctx, kind, subject); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// gone reports whether part (a stream, or "stream/consumer") has been
// missing for the settle time, recording when it was first seen missing
// and when to look again.
func (k *StreamKeeper) gone(part string) bool {
	now := k.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	since, ok := k.missing[part]
	if !ok {
		since = now
		k.missing[part] = now
	}
	if now.Sub(since) >= k.settle() {
		return true
	}
	if at := since.Add(k.settle()); k.due.IsZero() || at.Before(k.due) {
		k.due = at
	}
	return false
}

// present records that part exists; if it was missing (another replica
// recreated it), the fetch loops waiting on Back resume.
func (k *StreamKeeper) present(part string) {
	k.mu.Lock()
	_, was := k.missing[part]
	delete(k.missing, part)
	k.mu.Unlock()
	if was {
		k.signalBack()
	}
}

func (k *StreamKeeper) check(ctx context.Context, kind StreamKind, subject string) error {
	name := StreamName(k.prefix, kind)
	st, err := k.js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return k.recreate(ctx, kind, name, subject)
	case err != nil:
		return err
	}
	k.present(name)
	fresh := k.seen(kind, name, st.CachedInfo().Created, false)
	fresh = k.limitsChanged(kind, st.CachedInfo().Config) || fresh
	cname := name + "/" + ConsumerName(kind)
	_, err = k.js.Consumer(ctx, name, ConsumerName(kind))
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if k.gone(cname) {
			if err := k.recreateConsumer(ctx, kind, name); err != nil {
				return k.broken(ctx, kind, name, st, err)
			}
		}
	case err != nil:
		return err
	default:
		k.present(cname)
	}
	if fresh || k.probeDue(kind) {
		return k.probe(ctx, kind, name, st)
	}
	return nil
}

// recreate makes a missing stream again once it has stayed gone for the
// settle time, then its consumer, then probes it.
func (k *StreamKeeper) recreate(ctx context.Context, kind StreamKind, name, subject string) error {
	if !k.gone(name) {
		k.log.Info("stream missing; recreating it once it has stayed gone", "stream", name, "settle", k.settle())
		return nil
	}
	cfg := streamConfig(name, subject, k.subj.Probe(kind), k.replicas)
	cfg.MaxBytes = StreamSettings{MaxBytes: k.MaxBytes}.maxBytes()
	st, err := k.js.CreateStream(ctx, cfg)
	mine := err == nil
	if err != nil {
		if !lostCreateRace(err) {
			err = storageHint(err, cfg.MaxBytes)
			k.log.Error("stream missing and not recreated; its inputs are refused", "stream", name, "err", err)
			return err
		}
		// Another replica recreated it first: take that one.
		if st, err = k.js.Stream(ctx, name); err != nil {
			return err
		}
	}
	k.present(name)
	if mine {
		k.recreated(kind, name, PartStream)
	}
	k.seen(kind, name, st.CachedInfo().Created, mine)
	if err := ensureConsumer(ctx, k.js, name, consumerConfig(kind)); err != nil {
		k.log.Error("stream recreated without its consumer", "stream", name, "err", err)
		return k.broken(ctx, kind, name, st, err)
	}
	return k.probe(ctx, kind, name, st)
}

func (k *StreamKeeper) recreateConsumer(ctx context.Context, kind StreamKind, name string) error {
	if _, err := k.js.CreateConsumer(ctx, name, consumerConfig(kind)); err != nil {
		if lostCreateRace(err) {
			k.present(name + "/" + ConsumerName(kind))
			return nil // another replica was first
		}
		k.log.Error("consumer missing and not recreated", "stream", name, "consumer", ConsumerName(kind), "err", err)
		return err
	}
	k.present(name + "/" + ConsumerName(kind))
	k.recreated(kind, name, PartConsumer)
	return nil
}

func (k *StreamKeeper) probeDue(kind StreamKind) bool {
	every := k.ProbeEvery
	if every <= 0 {
		every = ProbeEveryDefault
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	at, ok := k.probed[kind]
	_, refusing := k.refusing[kind]
	return !ok || refusing || k.now().Sub(at) >= every
}

// probe publishes a probe message to the stream and checks JetStream's
// ack; the message is then deleted (unless the consumer took it first).
// A refusal is reported and, where repair is safe, repaired. An error that
// is no answer from the stream (a timeout, NATS down) is returned without
// a verdict.
func (k *StreamKeeper) probe(ctx context.Context, kind StreamKind, name string, st jetstream.Stream) error {
	msg := nats.NewMsg(k.subj.Probe(kind))
	msg.Header.Set(ProbeHeader, "1")
	ack, err := k.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(name))
	var apiErr *jetstream.APIError
	if err != nil && !errors.As(err, &apiErr) {
		return fmt.Errorf("bus: probe of stream %s: %w", name, err)
	}
	k.mu.Lock()
	k.probed[kind] = k.now()
	_, was := k.refusing[kind]
	if err != nil {
		k.refusing[kind] = err
	} else {
		delete(k.refusing, kind)
	}
	k.mu.Unlock()
	if k.OnProbe != nil {
		k.OnProbe(kind, name, err)
	}
	if err == nil {
		if was {
			k.log.Warn("stream accepts writes again", "stream", name)
			k.signalBack()
		}
		if derr := st.DeleteMsg(ctx, ack.Sequence); derr != nil && !errors.Is(derr, jetstream.ErrMsgNotFound) {
			k.log.Debug("probe message not deleted; the consumer acks it", "stream", name, "err", derr)
		}
		return nil
	}
	k.log.Warn("stream refuses writes: its inputs are refused until it is repaired", "stream", name,
		"err_code", apiErr.ErrorCode, "err", err)
	return k.repair(ctx, kind, name, st, apiErr)
}

// broken handles a consumer JetStream could not create in a present
// stream: an API error there (nats-server 2.9: "open …/obs/<consumer>/
// meta.inf: no such file or directory", err_code 10012, in a stream
// recreated while the old one's files were being removed) means the stream
// is broken like one that refuses writes, and it is reported and repaired
// the same way. Any other error (NATS unreachable) is returned as it is.
func (k *StreamKeeper) broken(ctx context.Context, kind StreamKind, name string, st jetstream.Stream, err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return err
	}
	k.mu.Lock()
	k.refusing[kind] = err
	k.probed[kind] = k.now()
	k.mu.Unlock()
	if k.OnProbe != nil {
		k.OnProbe(kind, name, err)
	}
	k.log.Warn("stream takes no consumer: its inputs are not read until it is repaired", "stream", name,
		"err_code", apiErr.ErrorCode, "err", err)
	return k.repair(ctx, kind, name, st, apiErr)
}

// repair deletes a stream that refuses writes with a store failure and
// holds no message (nothing is lost by it), so that the keeper recreates it
// once it has stayed gone for the settle time. A stream that refuses for
// another reason, or still holds messages, is left to the operator (it
// stays reported).
func (k *StreamKeeper) repair(ctx context.Context, kind StreamKind, name string, st jetstream.Stream, refusal *jetstream.APIError) error {
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("bus: stream %s refuses writes; reading it for repair: %w", name, err)
	}
	if (refusal.ErrorCode != jsErrStreamStoreFailed && refusal.ErrorCode != jetstream.JSErrCodeConsumerCreate) ||
		info.State.Msgs > 0 {
		k.log.Error("stream refuses writes and is not repaired (not a store failure, or it holds messages)",
			"stream", name, "err_code", refusal.ErrorCode, "msgs", info.State.Msgs)
		return nil
	}
	// Only the stream that was probed: if another replica repaired it
	// meanwhile, its new stream is probed at the next check instead.
	if !info.Created.Equal(st.CachedInfo().Created) {
		return nil
	}
	if err := k.js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("bus: deleting stream %s for repair: %w", name, err)
	}
	k.log.Warn("stream refusing writes deleted; recreated once it has stayed gone", "stream", name, "settle", k.settle())
	k.gone(name) // the settle counts from now
	return nil
}

// seen records the stream's creation time and reports a new stream (logged
// unless quiet: this keeper has just said it recreated it). It returns
// whether the stream is a new one, or the first this keeper saw.
func (k *StreamKeeper) seen(kind StreamKind, name string, created time.Time, quiet bool) bool {
	k.mu.Lock()
	prev, known := k.created[kind]
	k.created[kind] = created
	if !known || !prev.Equal(created) {
		delete(k.probed, kind) // a new stream is probed before it counts
	}
	k.mu.Unlock()
	if !known || prev.IsZero() || prev.Equal(created) {
		return !known
	}
	k.signalBack()
	if !quiet {
		k.log.Warn("stream is a new one since the last check (recreated elsewhere); the messages the old one held are lost",
			"stream", name, "created", created)
	}
	if k.OnReset != nil {
		k.OnReset(kind, name)
	}
	return true
}

// limitsChanged reports whether the settings that decide what a stream
// takes (its limits, discard policy, subjects, seal) differ from the last
// check: an operator's update can make a stream refuse writes, and a probe
// made just before it proves nothing, so the changed stream is probed again.
func (k *StreamKeeper) limitsChanged(kind StreamKind, c jetstream.StreamConfig) bool {
	sig := fmt.Sprintf("%d|%d|%d|%d|%d|%v|%v|%v|%v", c.MaxBytes, c.MaxMsgs, c.MaxMsgSize, c.MaxMsgsPerSubject,
		c.Discard, c.Subjects, c.Sealed, c.DenyDelete, c.MaxAge)
	k.mu.Lock()
	defer k.mu.Unlock()
	prev, known := k.limits[kind]
	k.limits[kind] = sig
	changed := known && prev != sig
	if changed {
		// A probe is due until one answers: the change is recorded now,
		// and a check that ends before its probe gives a verdict (a
		// consumer lookup or the probe itself timing out under load)
		// must not leave the stream unprobed until ProbeEvery.
		delete(k.probed, kind)
	}
	return changed
}

func (k *StreamKeeper) recreated(kind StreamKind, name, part string) {
	k.signalBack()
	if part == PartStream {
		k.log.Warn("stream was missing; recreated (messages it held are lost)", "stream", name)
	} else {
		k.log.Warn("consumer was missing; recreated", "stream", name, "consumer", ConsumerName(kind))
	}
	if k.OnRecreated != nil {
		k.OnRecreated(kind, name, part)
	}
}
