package intake

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/bus"
)

// Guard is the processed-message guard of the JetStream inputs. Handling a
// message and acking it are two steps; a node that dies between them leaves
// a message JetStream will offer again although its effect is durable. The
// guard closes that gap: before a message is acked, a Redis key named by its
// stream, stream sequence and the time JetStream stored it is set (TTL
// GuardTTL), and a redelivered message whose key exists is acked without
// being handled again.
//
// The sequence alone would not do: a stream deleted and recreated (by an
// operator, by a node that found it missing, or a JetStream store lost)
// numbers its messages from 1 again, and a new message would find the mark
// of an old one. The stored time is part of the message (every redelivery
// carries the same one) and differs between two lives of a stream, so the
// pair cannot repeat; no lookup of the stream's creation time is needed.
//
// Handling a message twice is harmless by design (a duplicate submit of a
// live job changes nothing, a result for a finished job is absorbed), so the
// guard is an economy and an accounting fix, not what correctness rests on:
// when Redis cannot be read the message is handled as usual.
//
// Cost: first deliveries are never checked (the check is one GET, only when
// JetStream says the message was delivered before), and the marks are
// written in pipelines by one goroutine that waits GuardLinger for a batch
// to gather, so a node pays one SET per message and a round trip per batch,
// off the job's path: the ack waits for the mark, the job does not.
type Guard struct {
	rdb    redis.UniversalClient
	prefix string
	log    *slog.Logger

	marks  chan guardMark
	stopMu sync.RWMutex // Ack holds it shared while queueing; Stop exclusively
	closed bool
	stop   chan struct{}
	done   chan struct{}

	// Skipped counts redelivered messages the guard acked unhandled, by
	// stream.
	Skipped *prometheus.CounterVec
}

// GuardTTL is how long a handled message is remembered. It exceeds the
// longest redelivery wait (bus.RedeliveryBackoff), so a message acked too
// late is still recognised when JetStream offers it again.
var GuardTTL = 2 * bus.RedeliveryBackoff[len(bus.RedeliveryBackoff)-1]

// guardBatch caps the marks written per pipeline.
const guardBatch = 512

// GuardLinger is how long the mark writer waits for more marks after the
// first of a batch. Without it a node at a modest rate (1,000 jobs/s) sends
// one pipeline per mark — two Redis round trips per job for the guard alone;
// with it, a few per hundred jobs. Only the ack waits for it (JetStream's
// ack wait is 30 s), never a job.
var GuardLinger = 5 * time.Millisecond

type guardMark struct {
	key string
	msg jetstream.Msg
}

// NewGuard returns a guard writing keys under prefix (the store's key
// prefix); Start it before use. reg may be nil.
func NewGuard(rdb redis.UniversalClient, prefix string, reg prometheus.Registerer, log *slog.Logger) *Guard {
	g := &Guard{rdb: rdb, prefix: prefix, log: log, marks: make(chan guardMark, 65536),
		stop: make(chan struct{}), done: make(chan struct{}),
		Skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_redeliveries_skipped_total",
			Help: "Redelivered JetStream messages acked without handling: they had been handled, not acked, before."},
			[]string{"stream"})}
	if reg != nil {
		_ = reg.Register(g.Skipped)
	}
	return g
}

// Start runs the mark writer.
func (g *Guard) Start() { go g.loop() }

// Stop writes the marks queued so far, acks their messages and returns.
func (g *Guard) Stop() {
	g.stopMu.Lock()
	if !g.closed {
		g.closed = true
		close(g.stop)
	}
	g.stopMu.Unlock()
	<-g.done
}

// key names the guard of one message: prefix +
// "seen:<stream>:<seq>:<stored unix ns>".
func (g *Guard) key(md *jetstream.MsgMetadata) string {
	return g.prefix + "seen:" + md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10) + ":" +
		strconv.FormatInt(md.Timestamp.UnixNano(), 10)
}

// Seen reports whether msg was handled before: only for a redelivery, and
// only when Redis answers within a second.
func (g *Guard) Seen(msg jetstream.Msg) bool {
	md, err := msg.Metadata()
	if err != nil || md.NumDelivered < 2 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	n, err := g.rdb.Exists(ctx, g.key(md)).Result()
	if err != nil || n == 0 {
		return false
	}
	g.Skipped.WithLabelValues(md.Stream).Inc()
	return true
}

// Wrap returns msg as a delivery whose Ack first marks it handled.
func (g *Guard) Wrap(msg jetstream.Msg) *GuardedMsg { return &GuardedMsg{Msg: msg, g: g} }

// GuardedMsg is a JetStream message whose Ack goes through the guard.
type GuardedMsg struct {
	jetstream.Msg
	g *Guard
}

// Ack queues the mark; the message is acked once the mark is written (or
// could not be: the ack is never withheld for the guard's sake).
func (m *GuardedMsg) Ack() error {
	md, err := m.Msg.Metadata()
	if err != nil {
		return m.Msg.Ack()
	}
	m.g.stopMu.RLock()
	defer m.g.stopMu.RUnlock()
	if m.g.closed {
		return m.Msg.Ack()
	}
	m.g.marks <- guardMark{key: m.g.key(md), msg: m.Msg}
	return nil
}

func (g *Guard) loop() {
	defer close(g.done)
	batch := make([]guardMark, 0, guardBatch)
	for {
		select {
		case mk := <-g.marks:
			batch = append(batch[:0], mk)
		case <-g.stop:
			// Drain what is queued, then leave.
			for {
				select {
				case mk := <-g.marks:
					batch = append(batch[:0], mk)
					g.flush(batch)
				default:
					return
				}
			}
		}
		g.fill(&batch)
		g.flush(batch)
	}
}

// fill adds marks to batch until it is full or GuardLinger has passed since
// its first.
func (g *Guard) fill(batch *[]guardMark) {
	linger := time.NewTimer(GuardLinger)
	defer linger.Stop()
	for len(*batch) < guardBatch {
		select {
		case mk := <-g.marks:
			*batch = append(*batch, mk)
		case <-linger.C:
			return
		case <-g.stop:
			return // Stop drains the rest
		}
	}
}

// flush writes one batch of marks and acks the messages.
func (g *Guard) flush(batch []guardMark) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	pipe := g.rdb.Pipeline()
	for _, mk := range batch {
		pipe.Set(ctx, mk.key, "1", GuardTTL)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		g.log.Debug("processed-message marks not written; acking anyway", "n", len(batch), "err", err)
	}
	cancel()
	for _, mk := range batch {
		_ = mk.msg.Ack()
	}
}
