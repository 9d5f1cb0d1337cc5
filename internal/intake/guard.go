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

	"github.com/troupe-run/troupe/internal/bus"
)

// Guard is the processed-message guard of the JetStream inputs. Handling a
// message and acking it are two steps; a node that dies between them leaves
// a message JetStream will offer again although its effect is durable. The
// guard closes that gap: before a message is acked, a mark naming it by its
// stream sequence and the time JetStream stored it is written to Redis (it
// lives at least GuardTTL), and a redelivered message whose mark exists is
// acked without being handled again.
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
// Layout: the marks of one stream are fields of hash keys, one key per
// guardBucket of stored time: key prefix + "seen:<stream>:<bucket start,
// unix s>", field "<seq>:<stored unix ns>". A redelivery carries its stored
// time, so its key and field are known without a lookup.
//
// Cost: first deliveries are never checked (the check is one HEXISTS, only
// when JetStream says the message was delivered before). The marks are
// written by one goroutine that waits GuardLinger for a batch to gather and
// writes each bucket key of the batch with one HSET of all its fields, so a
// batch costs one command per bucket key it touches (usually one per
// stream), whatever its size, and a round trip, off the job's path: the ack
// waits for the mark, the job does not. A bucket key gets an EXPIRE only when
// this process does not already know it lives long enough (see flush):
// about once per bucket key and process.
type Guard struct {
	rdb    redis.UniversalClient
	prefix string
	log    *slog.Logger

	marks  chan guardMark
	stopMu sync.RWMutex // Ack holds it shared while queueing; Stop exclusively
	closed bool
	stop   chan struct{}
	done   chan struct{}

	// lives holds, for the bucket keys this process gave a TTL, the time
	// until which that TTL keeps the key (by this process's clock, from
	// before the EXPIRE was sent). Only the mark writer's goroutine uses
	// it; prune drops the entries that can no longer spare an EXPIRE.
	lives    map[string]time.Time
	prunedAt time.Time
	// keys caches the bucket keys' names the writer used lately; only
	// its goroutine uses it, and prune clears it.
	keys map[bucketID]string

	// Skipped counts redelivered messages the guard acked unhandled, by
	// stream.
	Skipped *prometheus.CounterVec
}

// GuardTTL is how long a handled message is remembered at least, from when
// its mark is written. It exceeds the longest redelivery wait
// (bus.RedeliveryBackoff), so a message acked too late is still recognised
// when JetStream offers it again.
var GuardTTL = 2 * bus.RedeliveryBackoff[len(bus.RedeliveryBackoff)-1]

const (
	// guardBucket is how much stored time the marks of one bucket key
	// span.
	guardBucket = time.Second
	// guardHeadroom is how much longer than GuardTTL a bucket key's TTL
	// runs when the guard sets it, so that one EXPIRE covers every mark
	// written to the key in the next guardHeadroom: the whole bucket's,
	// when its messages are handled within 20 s of being stored.
	guardHeadroom = 30 * time.Second
	// guardWriteTimeout bounds one batch's write; a mark lands at the
	// latest this long after its batch was sent.
	guardWriteTimeout = 2 * time.Second
	// guardCreated is a field every HSET of marks also sets: when the
	// HSET reports it new, the key did not exist before (its bucket's
	// first write, or the key was lost: FLUSHALL, a restarted Redis
	// without persistence) and so has no TTL yet.
	guardCreated = "_"
)

// guardBatch caps the marks written per pipeline.
const guardBatch = 512

// GuardLinger is how long the mark writer waits for more marks after the
// first of a batch. Without it a node at a modest rate (1,000 jobs/s) sends
// one pipeline per mark — two Redis round trips per job for the guard alone;
// with it, a few per hundred jobs. Only the ack waits for it (JetStream's
// ack wait is 30 s), never a job.
var GuardLinger = 5 * time.Millisecond

type guardMark struct {
	stream     string
	seq        uint64
	storedNs   int64
	redelivery bool
	msg        jetstream.Msg
}

// bucketID is one bucket key of the marks: a stream's guardBucket.
type bucketID struct {
	stream string
	start  int64
}

// markID is one message of a batch.
type markID struct {
	stream   string
	seq      uint64
	storedNs int64
}

// NewGuard returns a guard writing keys under prefix (the store's key
// prefix); Start it before use. reg may be nil.
func NewGuard(rdb redis.UniversalClient, prefix string, reg prometheus.Registerer, log *slog.Logger) *Guard {
	g := &Guard{rdb: rdb, prefix: prefix, log: log, marks: make(chan guardMark, 65536),
		stop: make(chan struct{}), done: make(chan struct{}), lives: map[string]time.Time{}, keys: map[bucketID]string{},
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

// key names the bucket key holding the mark of one message: prefix +
// "seen:<stream>:<start of its guardBucket of stored time, unix s>".
func (g *Guard) key(md *jetstream.MsgMetadata) string {
	return g.bucketKey(md.Stream, bucketStart(md.Timestamp.UnixNano()))
}

// bucketStart is the start, in unix s, of the guardBucket holding a
// stored time of ns unix ns.
func bucketStart(ns int64) int64 {
	w := int64(guardBucket)
	return (ns - ((ns%w)+w)%w) / int64(time.Second) // floor, also before 1970
}

func (g *Guard) bucketKey(stream string, start int64) string {
	return g.prefix + "seen:" + stream + ":" + strconv.FormatInt(start, 10)
}

// field names the mark of one message in its bucket key: "<stream
// sequence>:<stored unix ns>".
func field(md *jetstream.MsgMetadata) string {
	return string(appendField(nil, md.Sequence.Stream, md.Timestamp.UnixNano()))
}

func appendField(b []byte, seq uint64, storedNs int64) []byte {
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, ':')
	return strconv.AppendInt(b, storedNs, 10)
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
	ok, err := g.rdb.HExists(ctx, g.key(md), field(md)).Result()
	if err != nil || !ok {
		return false
	}
	g.Skipped.WithLabelValues(md.Stream).Inc()
	return true
}

// Wrap returns msg as a delivery whose Ack first marks it handled.
func (g *Guard) Wrap(msg jetstream.Msg) *GuardedMsg {
	return &GuardedMsg{Msg: msg, g: g, kept: keptInProgress(msg)}
}

// GuardedMsg is a JetStream message whose Ack goes through the guard.
type GuardedMsg struct {
	jetstream.Msg
	g *Guard
	// kept: msg's fetch loop keeps it in progress (KeptInProgress), read
	// once when the message is wrapped, while it is in the cache: the
	// Toucher's check of a waiting job (jobactor.Touches) read it through
	// two interfaces from a message long out of the cache (issue 33,
	// round 12). A message's keeper never changes.
	kept bool
}

// KeptInProgress reports whether the message's fetch loop keeps it in
// progress at JetStream until it is settled (bus.KeepInProgress).
func (m *GuardedMsg) KeptInProgress() bool { return m.kept }

// keptInProgress reports whether msg's fetch loop keeps it in progress.
func keptInProgress(msg jetstream.Msg) bool {
	k, ok := msg.(interface{ KeptInProgress() bool })
	return ok && k.KeptInProgress()
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
	// The mark's key and field are named by the writer, a batch at a
	// time, not here on the job's path.
	m.g.marks <- guardMark{stream: md.Stream, seq: md.Sequence.Stream, storedNs: md.Timestamp.UnixNano(),
		redelivery: md.NumDelivered > 1, msg: m.Msg}
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
			// Drain what is queued, a full batch at a time, then leave.
			for {
				batch = batch[:0]
			drain:
				for len(batch) < guardBatch {
					select {
					case mk := <-g.marks:
						batch = append(batch, mk)
					default:
						break drain
					}
				}
				if len(batch) == 0 {
					return
				}
				g.flush(batch)
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

// bucketWrite is one bucket key's part of a batch.
type bucketWrite struct {
	key    string
	args   []interface{} // field, value, field, value...: guardCreated first
	expire bool          // an EXPIRE follows the HSET in the pipeline
	hset   *redis.IntCmd
	exp    *redis.BoolCmd
}

// flush writes one batch of marks and acks the messages. The marks of each
// bucket key go in one HSET. The key's TTL is set (EXPIRE, GuardTTL +
// guardHeadroom from now) in the same pipeline when this process does not
// know the key to live until GuardTTL after the write lands, or when a mark
// is a redelivered message's (its field may exist already, which would make
// the HSET's count of new fields ambiguous, below). Otherwise the HSET's
// count tells whether guardCreated was new, i.e. the key had been lost and
// the HSET created it without a TTL: a second pipeline then sets it.
//
// Every EXPIRE sets the same relative TTL, which Redis counts from when it
// runs the command, so a later EXPIRE (of this process or another node's)
// never shortens a key's life; no EXPIRE … GT is needed.
func (g *Guard) flush(batch []guardMark) {
	now := time.Now()
	need := now.Add(guardWriteTimeout + GuardTTL) // the latest a mark of this batch must live until
	keyTTL := GuardTTL + guardHeadroom
	writes := make([]*bucketWrite, 0, 4)
	byKey := make(map[bucketID]*bucketWrite, 4)
	marked := make(map[markID]bool, len(batch)) // a message acked twice is marked once
	// The batch's fields are written into one string and passed as
	// pointers to its substrings: a few allocations per batch, not
	// several per mark.
	buf := make([]byte, 0, 32*len(batch))
	ends := make([]int, 0, len(batch))
	for _, mk := range batch {
		id := markID{mk.stream, mk.seq, mk.storedNs}
		if marked[id] {
			continue
		}
		marked[id] = true
		buf = appendField(buf, mk.seq, mk.storedNs)
		ends = append(ends, len(buf))
	}
	all := string(buf)
	fields := make([]string, len(ends))
	for i, start := 0, 0; i < len(ends); i++ {
		fields[i], start = all[start:ends[i]], ends[i]
	}
	clear(marked)
	n := 0
	for _, mk := range batch {
		b := bucketID{mk.stream, bucketStart(mk.storedNs)}
		w := byKey[b]
		if w == nil {
			key, ok := g.keys[b]
			if !ok {
				key = g.bucketKey(b.stream, b.start)
				g.keys[b] = key
			}
			w = &bucketWrite{key: key, args: make([]interface{}, 0, 2*len(batch)+2), expire: g.lives[key].Before(need)}
			w.args = append(w.args, guardCreated, "1")
			byKey[b] = w
			writes = append(writes, w)
		}
		w.expire = w.expire || mk.redelivery
		if id := (markID{mk.stream, mk.seq, mk.storedNs}); !marked[id] {
			marked[id] = true
			w.args = append(w.args, &fields[n], "1")
			n++
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), guardWriteTimeout)
	pipe := g.rdb.Pipeline()
	for _, w := range writes {
		w.hset = pipe.HSet(ctx, w.key, w.args...)
		if w.expire {
			w.exp = pipe.Expire(ctx, w.key, keyTTL)
		}
	}
	_, err := pipe.Exec(ctx)
	cancel()
	var lost []*bucketWrite
	for _, w := range writes {
		switch {
		case w.exp != nil:
			if w.exp.Err() == nil && w.exp.Val() {
				g.lives[w.key] = now.Add(keyTTL)
			}
		case w.hset.Err() == nil && w.hset.Val() == int64(len(w.args)/2):
			lost = append(lost, w) // guardCreated was new: the key has no TTL
		}
	}
	if len(lost) > 0 {
		now = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), guardWriteTimeout)
		pipe := g.rdb.Pipeline()
		for _, w := range lost {
			w.exp = pipe.Expire(ctx, w.key, keyTTL)
		}
		if _, err2 := pipe.Exec(ctx); err2 != nil && err == nil {
			err = err2
		}
		cancel()
		for _, w := range lost {
			if w.exp.Err() == nil && w.exp.Val() {
				g.lives[w.key] = now.Add(keyTTL)
			} else {
				delete(g.lives, w.key)
			}
		}
	}
	if err != nil {
		g.log.Debug("processed-message marks not written; acking anyway", "n", len(batch), "err", err)
	}
	for _, mk := range batch {
		_ = mk.msg.Ack()
	}
	g.prune(now)
}

// prune forgets, at most once per guardBucket, the bucket keys whose known
// life would not spare an EXPIRE any more.
func (g *Guard) prune(now time.Time) {
	if now.Sub(g.prunedAt) < guardBucket {
		return
	}
	g.prunedAt = now
	clear(g.keys)
	for k, until := range g.lives {
		if until.Before(now.Add(guardWriteTimeout + GuardTTL)) {
			delete(g.lives, k)
		}
	}
}
