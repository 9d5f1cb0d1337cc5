package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// DLQ bounds. An entry keeps at most DLQRawPrefix bytes of a bad packet
// (with the whole packet's size and SHA-256) and DLQFieldMax bytes of each
// text field, so one entry costs Redis at most a few KiB whatever arrived;
// the stream as a whole holds at most Config.DLQMaxBytes of entries (and
// Config.DLQMaxLen of them), the oldest going first.
//
// No DLQ reader needs a whole packet: a retry (Node.RetryDLQ) re-submits
// the request recorded with the job, and a packet that never became a job
// cannot be retried; the prefix is there for an operator to see what came.
const (
	DLQRawPrefix = 4 << 10
	DLQFieldMax  = 1 << 10
	// DLQMaxBytesDefault is the DLQ's byte budget: 16,000 entries of the
	// largest kind, far more of the usual (a few hundred bytes each).
	DLQMaxBytesDefault = 64 << 20
)

// DLQEntry is one dead-lettered input or job (see jobstate.DLQEntry).
type DLQEntry = jobstate.DLQEntry

// clip cuts s to at most n bytes, on a UTF-8 boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}

// values returns the entry's fields as stored and their size in bytes.
func dlqValues(e *DLQEntry) ([]interface{}, int64) {
	at := e.At
	if at.IsZero() {
		at = time.Now()
	}
	raw, size, hash := e.Raw, int64(len(e.Raw)), ""
	if len(raw) > 0 {
		sum := sha256.Sum256(raw)
		hash = hex.EncodeToString(sum[:])
		if len(raw) > DLQRawPrefix {
			raw = raw[:DLQRawPrefix]
		}
	}
	vs := []interface{}{
		"job_id", clip(e.JobID, DLQFieldMax), "topic", clip(e.Topic, DLQFieldMax),
		"reason", clip(string(e.Reason), DLQFieldMax), "message", clip(e.Message, DLQFieldMax),
		"last_reason", clip(string(e.LastReason), DLQFieldMax), "subject", clip(e.Subject, DLQFieldMax),
		"trace_id", clip(e.TraceID, DLQFieldMax), "raw", raw,
		"raw_size", size, "raw_sha256", hash, "at", at.UnixMilli(),
	}
	// The script adds "bytes" and "cum" (two numbers) and the stream id.
	n := int64(len("bytes") + len("cum") + 3*20)
	for _, v := range vs {
		switch v := v.(type) {
		case string:
			n += int64(len(v))
		case []byte:
			n += int64(len(v))
		default:
			n += 20
		}
	}
	return vs, n
}

// dlqAddScript (lua/dlq_add.lua) appends an entry to the DLQ stream and
// keeps the stream within its byte budget; dlqAppendScript
// (lua/dlq_append.lua) does the same for an entry moved from a job's DLQ
// outbox, once however often it is moved. Both run the shared dlqWrite
// (lua/lib/dlq_write.lua), and both go with EVAL: a DLQ entry is rare, and
// EVAL gets no NOSCRIPT reply.
var (
	dlqAddScript    = luaScript("dlq_add", "dlq_write")
	dlqAppendScript = luaScript("dlq_append", "dlq_write")
)

type dlqAddCall struct {
	dlqKey string
	// maxLen is the stream's approximate MAXLEN, budget its byte budget,
	// size the entry's bytes.
	maxLen, budget, size int64
	fields               []interface{} // the entry's field, value pairs
}

func (dlqAddCall) script() *redis.Script { return dlqAddScript }
func (c dlqAddCall) keys() []string      { return []string{c.dlqKey} }
func (c dlqAddCall) args() []interface{} {
	return append([]interface{}{c.maxLen, c.budget, c.size}, c.fields...)
}

type dlqAppendCall struct {
	dlqKey, markKey string
	markTTLS        int64
	// As in dlqAddCall.
	maxLen, budget, size int64
	fields               []interface{}
}

func (dlqAppendCall) script() *redis.Script { return dlqAppendScript }
func (c dlqAppendCall) keys() []string      { return []string{c.dlqKey, c.markKey} }
func (c dlqAppendCall) args() []interface{} {
	return append([]interface{}{c.markTTLS, c.maxLen, c.budget, c.size}, c.fields...)
}

func (s *Store) addDLQ(ctx context.Context, c redis.Scripter, e *DLQEntry) redis.Cmder {
	vs, n := dlqValues(e)
	// EVAL, not EVALSHA: the entry may go in a writer's pipeline among the
	// ops of other jobs; the script is short and DLQ writes are rare.
	return evalScript(ctx, c, dlqAddCall{dlqKey: s.keys.DLQ(), maxLen: s.cfg.DLQMaxLen, budget: s.cfg.DLQMaxBytes,
		size: n, fields: vs})
}

// AddDLQ records e in the DLQ stream.
func (s *Store) AddDLQ(ctx context.Context, e *DLQEntry) error {
	if err := s.addDLQ(ctx, s.rdb, e).Err(); err != nil {
		return fmt.Errorf("store: dlq write: %w", err)
	}
	return nil
}

// DLQBytes returns the bytes the DLQ's entries hold (as AddDLQ counts them;
// entries written before the budget existed are not counted).
func (s *Store) DLQBytes(ctx context.Context) (int64, error) {
	pipe := s.rdb.Pipeline()
	first := pipe.XRangeN(ctx, s.keys.DLQ(), "-", "+", 1)
	last := pipe.XRevRangeN(ctx, s.keys.DLQ(), "+", "-", 1)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("store: dlq bytes: %w", err)
	}
	if len(first.Val()) == 0 || len(last.Val()) == 0 {
		return 0, nil
	}
	num := func(m redis.XMessage, k string) int64 {
		v, _ := m.Values[k].(string)
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	f, l := first.Val()[0], last.Val()[0]
	return num(l, "cum") - num(f, "cum") + num(f, "bytes"), nil
}

// ListDLQ returns up to n entries, newest first.
func (s *Store) ListDLQ(ctx context.Context, n int64) ([]DLQEntry, error) {
	msgs, err := s.rdb.XRevRangeN(ctx, s.keys.DLQ(), "+", "-", n).Result()
	if err != nil {
		return nil, fmt.Errorf("store: dlq read: %w", err)
	}
	out := make([]DLQEntry, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, dlqEntryOf(m))
	}
	return out, nil
}

// A DLQ entry that accompanies a job's state change (Op.DLQ with an
// OpTransition or an OpActivate) must be written exactly when the change
// applies: a fenced write, or the activation of a job that exists already,
// must not dead-letter anything. The change is one script in the job's hash
// slot and the DLQ stream is a global key in another slot, so in a Redis
// Cluster no one script can do both. The script therefore writes the entry
// to the job's shard outbox (Keys.DLQOutbox) in the same atomic step, and
// the entry then moves to the stream: right after the script's reply by the
// writer, or, if the writer's node died in between, by the due poller's
// flush (FlushDLQOutbox). The move is idempotent (dlqAppendScript keeps a
// mark per entry in the stream's slot), so the entry reaches the stream
// once however often it is moved.

// DLQMarkTTL is how long the mark of a moved DLQ entry is kept: far longer
// than an entry waits in its outbox (the flush runs every TrimEvery ticks).
const DLQMarkTTL = 24 * time.Hour

// outboxEntry is a DLQ entry as its outbox holds it.
type outboxEntry struct {
	ID string   `json:"id"`
	E  DLQEntry `json:"e"`
}

// encodeOutbox returns e as an outbox member under a fresh id; the entry's
// time is fixed now, so every move of it writes the same entry.
func encodeOutbox(e *DLQEntry) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	o := outboxEntry{ID: hex.EncodeToString(b[:]), E: *e}
	if o.E.At.IsZero() {
		o.E.At = time.Now()
	}
	data, err := json.Marshal(&o)
	if err != nil {
		panic("store: encode DLQ entry: " + err.Error()) // plain strings and bytes: cannot fail
	}
	return string(data)
}

func decodeOutbox(member string) (*outboxEntry, error) {
	var o outboxEntry
	if err := json.Unmarshal([]byte(member), &o); err != nil || o.ID == "" {
		return nil, fmt.Errorf("store: bad DLQ outbox entry %.80q: %v", member, err)
	}
	return &o, nil
}

// appendOutboxed queues the idempotent append of an outboxed entry to the
// DLQ stream.
func (s *Store) appendOutboxed(ctx context.Context, pipe redis.Pipeliner, o *outboxEntry) *redis.Cmd {
	vs, n := dlqValues(&o.E)
	return evalScript(ctx, pipe, dlqAppendCall{dlqKey: s.keys.DLQ(), markKey: s.keys.DLQMark(o.ID),
		markTTLS: int64(DLQMarkTTL / time.Second), maxLen: s.cfg.DLQMaxLen, budget: s.cfg.DLQMaxBytes, size: n, fields: vs})
}

// FlushDLQOutbox moves to the DLQ stream the outboxed entries (see above)
// written more than olderThan ago — the ones whose writer died before it
// moved them — up to perShard per shard, and returns how many it took out
// of the outboxes. An entry leaves its outbox only once the stream holds it.
func (s *Store) FlushDLQOutbox(ctx context.Context, olderThan time.Duration, perShard int64) (int, error) {
	cutoff := strconv.FormatInt(time.Now().Add(-olderThan).UnixMilli(), 10)
	pipe := s.rdb.Pipeline()
	reads := make([]*redis.StringSliceCmd, Shards)
	for i := range reads {
		reads[i] = pipe.ZRangeByScore(ctx, s.keys.DLQOutbox(i), &redis.ZRangeBy{Min: "-inf", Max: cutoff, Count: perShard})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("store: dlq outbox read: %w", err)
	}
	type moving struct {
		shard  int
		member string
		cmd    *redis.Cmd
	}
	var todo []moving
	var bad error
	pipe = s.rdb.Pipeline()
	for i, r := range reads {
		for _, m := range r.Val() {
			o, err := decodeOutbox(m)
			if err != nil {
				bad = err // left in place for an operator to see
				continue
			}
			todo = append(todo, moving{shard: i, member: m, cmd: s.appendOutboxed(ctx, pipe, o)})
		}
	}
	if len(todo) == 0 {
		return 0, bad
	}
	_, _ = pipe.Exec(ctx)
	pipe = s.rdb.Pipeline()
	moved := 0
	for _, m := range todo {
		if err := m.cmd.Err(); err != nil {
			bad = fmt.Errorf("store: dlq outbox flush: %w", err)
			continue
		}
		pipe.ZRem(ctx, s.keys.DLQOutbox(m.shard), m.member)
		moved++
	}
	if moved > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return moved, fmt.Errorf("store: dlq outbox flush: %w", err)
		}
	}
	return moved, bad
}
