package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/core"
)

// DLQEntry is one dead-lettered input or job.
type DLQEntry struct {
	// ID is the entry's stream id (set when read back).
	ID      string
	JobID   string
	Topic   string
	Reason  core.Reason
	Message string
	// LastReason keeps the underlying cause when Reason summarises it
	// (for example max_scheduling_retries after no_workers).
	LastReason core.Reason
	Subject    string
	TraceID    string
	// Raw is the packet as received, when it could not be decoded or used.
	Raw []byte
	At  time.Time
}

func (e *DLQEntry) values() []interface{} {
	at := e.At
	if at.IsZero() {
		at = time.Now()
	}
	return []interface{}{
		"job_id", e.JobID, "topic", e.Topic, "reason", string(e.Reason), "message", e.Message,
		"last_reason", string(e.LastReason), "subject", e.Subject, "trace_id", e.TraceID,
		"raw", e.Raw, "at", at.UnixMilli(),
	}
}

func (s *Store) addDLQ(ctx context.Context, c redis.Cmdable, e *DLQEntry) *redis.StringCmd {
	return c.XAdd(ctx, &redis.XAddArgs{
		Stream: s.keys.DLQ(), MaxLen: s.cfg.DLQMaxLen, Approx: true, Values: e.values(),
	})
}

// AddDLQ records e in the DLQ stream.
func (s *Store) AddDLQ(ctx context.Context, e *DLQEntry) error {
	if err := s.addDLQ(ctx, s.rdb, e).Err(); err != nil {
		return fmt.Errorf("store: dlq write: %w", err)
	}
	return nil
}

// ListDLQ returns up to n entries, newest first.
func (s *Store) ListDLQ(ctx context.Context, n int64) ([]DLQEntry, error) {
	msgs, err := s.rdb.XRevRangeN(ctx, s.keys.DLQ(), "+", "-", n).Result()
	if err != nil {
		return nil, fmt.Errorf("store: dlq read: %w", err)
	}
	out := make([]DLQEntry, 0, len(msgs))
	for _, m := range msgs {
		str := func(k string) string { v, _ := m.Values[k].(string); return v }
		e := DLQEntry{ID: m.ID, JobID: str("job_id"), Topic: str("topic"), Reason: core.Reason(str("reason")),
			Message: str("message"), LastReason: core.Reason(str("last_reason")), Subject: str("subject"),
			TraceID: str("trace_id"), Raw: []byte(str("raw")), At: parseMillis(str("at"))}
		out = append(out, e)
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
	args := append([]interface{}{int64(DLQMarkTTL / time.Second), s.cfg.DLQMaxLen}, o.E.values()...)
	return dlqAppendScript.Eval(ctx, pipe, []string{s.keys.DLQ(), s.keys.DLQMark(o.ID)}, args...)
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
