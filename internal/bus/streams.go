package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream settings.
const (
	// AckWaitDefault is how long JetStream waits for an ack before
	// redelivering. Troupe acks a submit once the job is durable in Redis, a
	// result once its transition is written: milliseconds in normal
	// operation. RedeliveryBackoff overrides it per delivery.
	AckWaitDefault = 30 * time.Second
	// MaxDeliverDefault bounds redelivery of a message that is never acked:
	// with RedeliveryBackoff, 20 deliveries span about 16 minutes.
	MaxDeliverDefault = 20
	// MaxAckPendingDefault bounds un-acked messages per consumer, shared by
	// every replica. A job waiting for room within its capacity grace keeps
	// its submit un-acked (up to actors.MaxUnwrittenWaitsDefault, 25,000,
	// per node), so this leaves room for 8 replicas' full waits.
	MaxAckPendingDefault = 200_000
	// StreamMaxAge bounds how long an unconsumed message is kept.
	StreamMaxAge = 72 * time.Hour
	// StreamMaxMsgs and StreamMaxBytes bound each input stream, so a flood
	// of publishes fills a bounded stream instead of the server's disk.
	// They are far above a healthy backlog (MaxAckPendingDefault
	// messages of a few KiB); once reached, new publishes are refused
	// (DiscardNew: the publisher gets an error) rather than accepted
	// messages dropped unread.
	StreamMaxMsgs  = 500_000
	StreamMaxBytes = 256 << 20
	// FetchBatch is the pull size; measured here, 256 is the knee.
	FetchBatch = 256
	// HoldPoll is how often a held fetch loop (see Consume) looks again.
	HoldPoll = 5 * time.Millisecond
	// MaxStreamReplicas is JetStream's largest replica count.
	MaxStreamReplicas = 5
)

// RedeliveryBackoff is how long JetStream waits for the ack of the n-th
// delivery before offering the message again (the last value repeats). The
// first wait is short because the usual reason a message goes unacked is
// that the node which fetched it died: a survivor should see it within
// seconds, not after a 30 s ack wait. Later waits grow so that a long Redis
// outage (during which messages are held, not acked) does not use the
// delivery budget up in a minute. A node that holds a message longer (Redis
// slow) merely sees it again; handling a message twice is harmless.
var RedeliveryBackoff = []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 30 * time.Second, 60 * time.Second}

// StreamKind names one of Troupe's input streams.
type StreamKind string

const (
	StreamSubmit StreamKind = "SUBMIT"
	StreamResult StreamKind = "RESULT"
	StreamCancel StreamKind = "CANCEL"
)

// StreamName returns the stream name for kind under prefix (e.g. "TROUPE").
func StreamName(prefix string, kind StreamKind) string { return prefix + "_" + string(kind) }

// ConsumerName is the durable consumer every replica shares for kind.
func ConsumerName(kind StreamKind) string { return "troupe-" + strings.ToLower(string(kind)) }

// EnsureStreams creates (or updates) the work-queue streams for submits,
// results and cancels and their shared durable pull consumers, with one
// replica each.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, prefix string, subj Subjects) error {
	return EnsureReplicatedStreams(ctx, js, prefix, subj, 1)
}

// EnsureReplicatedStreams is EnsureStreams with replicas copies of every
// stream (and of its consumer, which follows the stream) on a JetStream
// cluster: 3 keeps the streams available, and no acknowledged message
// lost, when one of three servers dies. replicas must be 1..5 (JetStream's
// limit); a single server accepts only 1. Changing it on an existing stream
// updates the stream in place.
func EnsureReplicatedStreams(ctx context.Context, js jetstream.JetStream, prefix string, subj Subjects, replicas int) error {
	return EnsureStreamsWith(ctx, js, prefix, subj, StreamSettings{Replicas: replicas})
}

// StreamSettings are the operator's choices for Troupe's input streams.
type StreamSettings struct {
	// Replicas is each stream's copies (1..MaxStreamReplicas).
	Replicas int
	// MaxBytes bounds each stream (0: StreamMaxBytes). JetStream reserves
	// it from the server's (or the account's) file storage when the stream
	// is made, whatever the stream then holds: a prefix's three streams
	// reserve three times it.
	MaxBytes int64
}

func (s StreamSettings) maxBytes() int64 {
	if s.MaxBytes <= 0 {
		return StreamMaxBytes
	}
	return s.MaxBytes
}

// jsErrStorageExceeded is JetStream's "insufficient storage resources
// available": the stream's MaxBytes does not fit in what the server or the
// account has left to reserve.
const jsErrStorageExceeded jetstream.ErrorCode = 10047

// EnsureStreamsWith is EnsureReplicatedStreams with every setting. A stream
// that exists with another MaxBytes is updated to this one. A stream that
// does not fit in JetStream's storage fails with an error that says what
// each stream reserves and how to change it.
func EnsureStreamsWith(ctx context.Context, js jetstream.JetStream, prefix string, subj Subjects, set StreamSettings) error {
	if set.Replicas < 1 || set.Replicas > MaxStreamReplicas {
		return fmt.Errorf("bus: stream replicas %d: want 1..%d", set.Replicas, MaxStreamReplicas)
	}
	// The streams that exist first: an update that lowers a bound gives
	// back storage that a stream still to be made may need.
	subjects := streamSubjects(subj)
	kinds := make([]StreamKind, 0, len(subjects))
	for kind := range subjects {
		kinds = append(kinds, kind)
	}
	slices.Sort(kinds)
	exists := map[StreamKind]bool{}
	for _, kind := range kinds {
		_, err := js.Stream(ctx, StreamName(prefix, kind))
		exists[kind] = err == nil
	}
	slices.SortStableFunc(kinds, func(a, b StreamKind) int {
		switch {
		case exists[a] == exists[b]:
			return 0
		case exists[a]:
			return -1
		}
		return 1
	})
	for _, kind := range kinds {
		subject := subjects[kind]
		name := StreamName(prefix, kind)
		cfg := streamConfig(name, subject, subj.Probe(kind), set.Replicas)
		cfg.MaxBytes = set.maxBytes()
		if _, err := ensureStream(ctx, js, cfg); err != nil {
			return fmt.Errorf("bus: stream %s: %w", name, storageHint(err, cfg.MaxBytes))
		}
		if err := ensureConsumer(ctx, js, name, consumerConfig(kind)); err != nil {
			return fmt.Errorf("bus: consumer %s/%s: %w", name, ConsumerName(kind), err)
		}
	}
	return nil
}

// JetStream error codes that mean another creator got there first. Two
// replicas starting at once both find a stream missing and both create it;
// nats-server 2.9 can answer the loser "subjects overlap with an existing
// stream" (the winner's stream holds the subjects) instead of taking the
// identical config as a repeat.
const (
	jsErrStreamSubjectOverlap jetstream.ErrorCode = 10065
	// "error creating store for stream": nats-server 2.9 removes an
	// account's empty streams directory when its last stream goes, and a
	// create racing that removal fails its mkdir (ENOENT). The next try
	// finds the directory made again.
	jsErrStreamStoreCreate jetstream.ErrorCode = 10049
)

// Concurrent creation is retried this often, backoff doubling from
// ensureBackoff: about 3 s in all, ample for the winner's create to land.
const (
	ensureTries   = 8
	ensureBackoff = 25 * time.Millisecond
)

// onConcurrentCreate, when set (tests), is called each time a create loses
// to a concurrent creator, before the stream is read again.
var onConcurrentCreate func(name string)

// lostCreateRace reports whether err says that someone else created the
// stream or consumer (or holds its subjects) at the same moment.
func lostCreateRace(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jsErrStreamSubjectOverlap, jsErrStreamStoreCreate, jetstream.JSErrCodeStreamNameInUse, jetstream.JSErrCodeConsumerNameExists,
			jetstream.JSErrCodeConsumerExists, jetstream.JSErrCodeConsumerAlreadyExists:
			return true
		}
	}
	return errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) || errors.Is(err, jetstream.ErrConsumerExists)
}

// ensureStream creates the stream cfg describes, or updates it where its
// settings differ, tolerating a concurrent creator: when the create loses
// the race, the stream is read again and, if it is there with cfg's
// settings, taken as it is; if its settings differ, the next try updates
// it. A subject overlap that does not go away (another stream owns the
// subjects for good) fails after ensureTries with JetStream's error.
//
// It reads before it writes, and updates only a stream it found: nats-server
// 2.9 was seen to crash (a nil dereference in its stream update) when an
// update reached a stream another client was creating at that moment, which
// CreateOrUpdateStream from replicas starting together does.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	backoff := ensureBackoff
	for try := 1; ; try++ {
		st, err := js.Stream(ctx, cfg.Name)
		switch {
		case err == nil && sameStream(st.CachedInfo().Config, cfg):
			return st, nil
		case err == nil && interestStream(st.CachedInfo().Config, cfg):
			// JetStream cannot change a stream's retention; with the
			// shared consumer alone, interest retention removes a
			// message at its ack, as a work queue does.
			return st, nil
		case err == nil:
			st, err = js.UpdateStream(ctx, cfg)
		case errors.Is(err, jetstream.ErrStreamNotFound):
			st, err = js.CreateStream(ctx, cfg)
		}
		if err == nil {
			return st, nil
		}
		if !lostCreateRace(err) || try == ensureTries {
			return nil, err
		}
		if onConcurrentCreate != nil {
			onConcurrentCreate(cfg.Name)
		}
		sleep(ctx, backoff)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (after %v)", err, ctx.Err())
		}
		backoff *= 2
	}
}

// sameStream reports whether a stream's config has the settings Troupe
// relies on.
func sameStream(got, want jetstream.StreamConfig) bool {
	return slices.Equal(got.Subjects, want.Subjects) && got.Retention == want.Retention && got.Storage == want.Storage && got.Replicas == want.Replicas &&
		got.MaxAge == want.MaxAge && got.Discard == want.Discard && got.MaxBytes == want.MaxBytes
}

// interestStream reports whether got is an interest-retention stream
// (a result stream made by a build of 2026-11-26, which read it through a
// consumer per node) where want is a work queue: otherwise the same.
func interestStream(got, want jetstream.StreamConfig) bool {
	if got.Retention != jetstream.InterestPolicy || want.Retention != jetstream.WorkQueuePolicy {
		return false
	}
	got.Retention = want.Retention
	return sameStream(got, want)
}

// storageHint adds to JetStream's refusal of a stream that does not fit in
// its storage what the stream asked to reserve and which settings move it.
func storageHint(err error, maxBytes int64) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jsErrStorageExceeded {
		return err
	}
	return fmt.Errorf("%w: the stream reserves %d MiB of JetStream file storage (each of a prefix's 3 streams does); "+
		"lower it with --stream-max-bytes (Tuning.StreamMaxBytes), or give JetStream more (the server's max_file_store, the account's limit), "+
		"or delete streams left by other prefixes", err, maxBytes>>20)
}

// ensureConsumer is ensureStream for a durable consumer.
func ensureConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) error {
	backoff := ensureBackoff
	for try := 1; ; try++ {
		_, err := js.CreateOrUpdateConsumer(ctx, stream, cfg)
		if err == nil {
			return nil
		}
		if !lostCreateRace(err) || try == ensureTries {
			return err
		}
		sleep(ctx, backoff)
		if ctx.Err() != nil {
			return fmt.Errorf("%w (after %v)", err, ctx.Err())
		}
		backoff *= 2
	}
}

func streamSubjects(subj Subjects) map[StreamKind]string {
	return map[StreamKind]string{StreamSubmit: subj.Submit, StreamResult: subj.Result, StreamCancel: subj.Cancel}
}

// streamConfig is a stream's settings: the CAP subject it carries and the
// keeper's probe subject (see Subjects.Probe).
func streamConfig(name, subject, probe string, replicas int) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:      name,
		Subjects:  []string{subject, probe},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		MaxAge:    StreamMaxAge,
		MaxMsgs:   StreamMaxMsgs,
		MaxBytes:  StreamMaxBytes,
		Discard:   jetstream.DiscardNew,
		Replicas:  replicas,
	}
}

func consumerConfig(kind StreamKind) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       ConsumerName(kind),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       AckWaitDefault,
		MaxDeliver:    MaxDeliverDefault,
		BackOff:       RedeliveryBackoff,
		MaxAckPending: MaxAckPendingDefault,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

// ConsumeOption adjusts Consume.
type ConsumeOption func(*consumeOpts)

type consumeOpts struct {
	onFetchError func(error)
	resume       func() <-chan struct{}
	room         func() int
	// keep: see KeepInProgress (maxAge; 0: not kept).
	keep                 time.Duration
	keepFirst, keepEvery time.Duration
	keepTouches          *atomic.Uint64
	keepWhile            func() bool
	onKeeper             func(*progressKeeper) // tests: the keeper Consume made
}

// KeepInProgress has Consume's fetch loops keep every message they fetch
// in progress at JetStream until it is settled (see progressKeeper):
// KeepFirst after its fetch, then every KeepEvery, for at most maxAge from
// its fetch (≤ 0: an hour). touches, when set, counts the in-progress
// signals sent.
func KeepInProgress(maxAge time.Duration, touches *atomic.Uint64) ConsumeOption {
	return func(o *consumeOpts) {
		o.keep = maxAge
		if o.keep <= 0 {
			o.keep = time.Hour
		}
		o.keepFirst, o.keepEvery = KeepFirst, KeepEvery
		o.keepTouches = touches
	}
}

// KeepWhile has the progress keeper (KeepInProgress) touch nothing while
// ok says false: the node cannot finish what it holds (its lock renewals
// are late: Redis unreachable, or the node stalled), so its held messages
// go back to JetStream's redelivery, for a replica, within the redelivery
// wait of their last touch.
func KeepWhile(ok func() bool) ConsumeOption {
	return func(o *consumeOpts) { o.keepWhile = ok }
}

// FetchRoom bounds each fetch by room (asked before every fetch): how many
// more messages the handler should take now, split between the FetchLoops
// loops (at least one each, at most FetchBatch); 0 or less holds the loop
// as hold does. A node pulls submits no faster than it admits them: a
// fetch of FetchBatch past a small room would take that many at once and
// leave the other replicas, still pulling, the rest — one node took most
// of a burst while the others, at their bound, waited.
func FetchRoom(room func() int) ConsumeOption {
	return func(o *consumeOpts) { o.room = room }
}

// fetchSize is the batch the next fetch asks for (0: hold).
func (o consumeOpts) fetchSize() int {
	if o.room == nil {
		return FetchBatch
	}
	r := o.room()
	if r <= 0 {
		return 0
	}
	return min(FetchBatch, (r+FetchLoops-1)/FetchLoops)
}

// ResumeOn has a fetch loop that backs off after failed fetches try again
// as soon as the channel f returns (read at each failure) is closed: a
// StreamKeeper's Back, closed when it has recreated a stream or consumer.
// Without it a loop whose backoff has grown to 5 s while its stream was
// missing leaves the new stream unread that long.
func ResumeOn(f func() <-chan struct{}) ConsumeOption {
	return func(o *consumeOpts) { o.resume = f }
}

// OnFetchError has Consume call f (on its fetch goroutine, so f must not
// block) whenever a fetch fails: a StreamKeeper's Kick.
func OnFetchError(f func(error)) ConsumeOption {
	return func(o *consumeOpts) { o.onFetchError = f }
}

// FetchLoops is how many fetch loops pull from each stream at once. A
// pull that ends by expiry (below FetchBatch messages a second, every
// pull does) was now and then not seen to end by nats.go's Fetch, which
// then waited its own idle timeout, about a second more (measured with
// nats.go alone: 2 of 61 fetches at 200 messages/s; a puller waits the
// same second when the expiry status never comes); with one loop, messages
// that arrive meanwhile wait for it. With two, the server hands them to the other loop's pull;
// both stalling at once is the rare case. At full speed the second pull is
// already waiting when the first batch is full.
//
// At low rates each fetch lasts its whole max wait, so loops started
// together would expire together, and a hiccup at that moment would catch
// both: loop i starts i/FetchLoops of a max wait late and waits
// FetchMaxWait + i×fetchWaitSpread, so their expiries drift apart.
const FetchLoops = 2

// FetchMaxWait is a fetch's max wait; fetchWaitSpread is added per loop.
const (
	FetchMaxWait    = time.Second
	fetchWaitSpread = 137 * time.Millisecond
)

// Consume pulls from the durable consumer kind in batches and calls handle for
// every message until ctx ends, from FetchLoops goroutines at once (handle
// must be safe for concurrent use). Each sends JetStream pull requests in a
// loop (see puller) rather than using nats.go's Consume(), measured here
// stalling for ~30 s in about one run in ten: a pull cannot stall past its
// own max wait.
//
// hold, when set, is asked before every fetch: while it says true the loop
// waits (checking every HoldPoll) instead of pulling more — the node's
// backpressure when it holds as many waiting submits as it should.
//
// A failed fetch (the consumer or its stream deleted, JetStream gone) is
// logged at WARN, reported to OnFetchError, and retried after a backoff
// (100 ms doubling to 5 s). The loop fetches by the consumer's name, so it
// resumes by itself once the consumer exists again.
func Consume(ctx context.Context, js jetstream.JetStream, prefix string, kind StreamKind,
	log *slog.Logger, handle func(jetstream.Msg), hold func() bool, opts ...ConsumeOption) error {
	var o consumeOpts
	for _, opt := range opts {
		opt(&o)
	}
	if _, err := js.Consumer(ctx, StreamName(prefix, kind), ConsumerName(kind)); err != nil {
		return fmt.Errorf("bus: consumer %s: %w", kind, err)
	}
	var keep *progressKeeper
	if o.keep > 0 {
		keep = newProgressKeeper(js.Conn(), o.keepFirst, o.keepEvery, o.keep)
		if o.keepTouches != nil {
			keep.touches = o.keepTouches
		}
		keep.while = o.keepWhile
		if o.onKeeper != nil {
			o.onKeeper(keep)
		}
		go keep.loop(ctx)
	}
	for i := range FetchLoops {
		start := time.Duration(i) * FetchMaxWait / FetchLoops
		wait := FetchMaxWait + time.Duration(i)*fetchWaitSpread
		p := newPuller(js, StreamName(prefix, kind), ConsumerName(kind))
		p.keep = keep
		go fetchLoop(ctx, p, StreamName(prefix, kind), log, handle, hold, start, wait, o)
	}
	return nil
}

// fetchLoop is one of Consume's loops.
func fetchLoop(ctx context.Context, p *puller, stream string, log *slog.Logger,
	handle func(jetstream.Msg), hold func() bool, start, wait time.Duration, o consumeOpts) {
	sleep(ctx, start)
	handle = skipProbes(handle)
	backoff := 100 * time.Millisecond
	failed := func(err error) {
		var back <-chan struct{}
		if o.resume != nil {
			back = o.resume()
		}
		log.Warn("fetch failed", "stream", stream, "err", err)
		if o.onFetchError != nil {
			o.onFetchError(err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
			backoff = min(backoff*2, 5*time.Second)
		case <-back:
			backoff = 100 * time.Millisecond // the stream or its consumer is back
		}
		t.Stop()
	}
	for ctx.Err() == nil {
		if hold != nil && hold() {
			sleep(ctx, HoldPoll)
			continue
		}
		size := o.fetchSize()
		if size == 0 {
			sleep(ctx, HoldPoll)
			continue
		}
		n, err := p.pull(ctx, size, wait, handle)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if n > 0 {
				backoff = 100 * time.Millisecond // it did deliver: retry soon
			}
			failed(err)
			continue
		}
		backoff = 100 * time.Millisecond
	}
}

// skipProbes acks a keeper's probe instead of handing it to handle.
func skipProbes(handle func(jetstream.Msg)) func(jetstream.Msg) {
	return func(msg jetstream.Msg) {
		if IsProbe(msg) {
			_ = msg.Ack()
			return
		}
		handle(msg)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
