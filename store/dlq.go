package store

import (
	"context"
	"fmt"
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
