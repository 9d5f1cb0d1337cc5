package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// Operators' DLQ actions: read one entry, delete it, and retry it as a new
// job linked to the original.

// DLQ errors.
var (
	// ErrDLQNotFound is returned for a DLQ entry id the stream does not hold
	// (never written, deleted, or trimmed away).
	ErrDLQNotFound = errors.New("store: dlq entry not found")
	// ErrAlreadyRetried is returned when a DLQ entry was already retried;
	// the error text names the job it became.
	ErrAlreadyRetried = errors.New("store: dlq entry already retried")
	// ErrNotRetryable is returned for an entry that cannot become a job
	// again: an input that never was one (undecodable bytes, an invalid
	// request), or a job whose record has expired.
	ErrNotRetryable = errors.New("store: dlq entry cannot be retried")
)

// DLQEntryByID returns one DLQ entry.
func (s *Store) DLQEntryByID(ctx context.Context, entryID string) (*DLQEntry, error) {
	if !validStreamID(entryID) {
		return nil, ErrDLQNotFound
	}
	msgs, err := s.rdb.XRange(ctx, s.keys.DLQ(), entryID, entryID).Result()
	if err != nil {
		return nil, fmt.Errorf("store: dlq read %s: %w", entryID, err)
	}
	if len(msgs) == 0 {
		return nil, ErrDLQNotFound
	}
	e := dlqEntryOf(msgs[0])
	return &e, nil
}

func dlqEntryOf(m redis.XMessage) DLQEntry {
	str := func(k string) string { v, _ := m.Values[k].(string); return v }
	e := DLQEntry{ID: m.ID, JobID: str("job_id"), Topic: str("topic"), Reason: jobstate.Reason(str("reason")),
		Message: str("message"), LastReason: jobstate.Reason(str("last_reason")), Subject: str("subject"),
		TraceID: str("trace_id"), Raw: []byte(str("raw")), RawSHA256: str("raw_sha256"), At: parseMillis(str("at"))}
	e.RawSize, _ = strconv.ParseInt(str("raw_size"), 10, 64)
	if e.RawSize == 0 {
		e.RawSize = int64(len(e.Raw)) // written before raw_size existed: whole
	}
	return e
}

// DeleteDLQ removes a DLQ entry (and its retry mark).
func (s *Store) DeleteDLQ(ctx context.Context, entryID string) error {
	if !validStreamID(entryID) {
		return ErrDLQNotFound
	}
	// Two keys in two slots: a pipeline, not a MULTI (a cluster refuses a
	// cross-slot transaction). A mark left behind by a failure between the
	// two names a job that exists and expires with the retention period.
	pipe := s.rdb.Pipeline()
	del := pipe.XDel(ctx, s.keys.DLQ(), entryID)
	pipe.Del(ctx, s.keys.DLQRetried(entryID))
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("store: dlq delete %s: %w", entryID, err)
	}
	if del.Val() == 0 {
		return ErrDLQNotFound
	}
	return nil
}

// validStreamID reports whether id has the form of a stream entry id
// ("<ms>-<seq>"); anything else names no entry, and Redis would answer it
// with an error rather than an empty result.
func validStreamID(id string) bool {
	ms, seq, ok := strings.Cut(id, "-")
	if !ok {
		return false
	}
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return err1 == nil && err2 == nil
}

// DLQRetried returns the job a DLQ entry was retried as ("" if none).
func (s *Store) DLQRetried(ctx context.Context, entryID string) (string, error) {
	v, err := s.rdb.Get(ctx, s.keys.DLQRetried(entryID)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("store: dlq retry mark %s: %w", entryID, err)
	}
	return v, nil
}

// DLQRetriedMany is DLQRetried for several entries in one round trip.
func (s *Store) DLQRetriedMany(ctx context.Context, entryIDs []string) (map[string]string, error) {
	out := map[string]string{}
	if len(entryIDs) == 0 {
		return out, nil
	}
	// One GET per mark in a pipeline rather than an MGET: the marks hash
	// to different slots, and a cluster refuses a cross-slot MGET.
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(entryIDs))
	for i, id := range entryIDs {
		cmds[i] = pipe.Get(ctx, s.keys.DLQRetried(id))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("store: dlq retry marks: %w", err)
	}
	for i, c := range cmds {
		if v, err := c.Result(); err == nil {
			out[entryIDs[i]] = v
		}
	}
	return out, nil
}

// ClaimDLQRetry marks entryID as retried as newJobID. Unless force is set,
// only the first claim wins: a second retry of the same entry (a double
// click, two operators) fails with ErrAlreadyRetried instead of running the
// job twice. The mark expires with the retention period, like the jobs.
func (s *Store) ClaimDLQRetry(ctx context.Context, entryID, newJobID string, force bool) error {
	key := s.keys.DLQRetried(entryID)
	ttl := s.linkTTL()
	if force {
		if err := s.rdb.Set(ctx, key, newJobID, ttl).Err(); err != nil {
			return fmt.Errorf("store: dlq retry mark %s: %w", entryID, err)
		}
		return nil
	}
	// SETNX, then a read of the winner: SET NX GET would be one round trip
	// but needs Redis 7, and the embedded store does not take it.
	ok, err := s.rdb.SetNX(ctx, key, newJobID, ttl).Result()
	if err != nil {
		return fmt.Errorf("store: dlq retry mark %s: %w", entryID, err)
	}
	if ok {
		return nil
	}
	prev, _ := s.rdb.Get(ctx, key).Result()
	return fmt.Errorf("%w as %s", ErrAlreadyRetried, prev)
}

// ReleaseDLQRetry drops a retry mark whose job could not be submitted, so
// the entry can be retried again.
func (s *Store) ReleaseDLQRetry(ctx context.Context, entryID, newJobID string) error {
	key := s.keys.DLQRetried(entryID)
	// Only our own mark: a forced retry may have replaced it meanwhile.
	return s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		v, err := tx.Get(ctx, key).Result()
		if err != nil || v != newJobID {
			return nil
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error { p.Del(ctx, key); return nil })
		return err
	}, key)
}

// linkTTL is how long retry marks and links live: the retention period
// (0 = forever when retention is off).
func (s *Store) linkTTL() time.Duration {
	if s.cfg.Retention <= 0 {
		return 0
	}
	return s.cfg.Retention
}

// JobLinks are the retry links of a job.
type JobLinks struct {
	// RetryOf is the job this one re-runs, DLQEntry the entry it came from.
	RetryOf  string
	DLQEntry string
	// Retries are the jobs that re-run this one, oldest first.
	Retries []string
}

// NextRetryNumber returns 1 for a job's first retry, 2 for its second, ...
func (s *Store) NextRetryNumber(ctx context.Context, jobID string) (int64, error) {
	key := s.keys.Links(jobID)
	pipe := s.rdb.TxPipeline()
	n := pipe.HIncrBy(ctx, key, "retry_seq", 1)
	if ttl := s.linkTTL(); ttl > 0 {
		pipe.Expire(ctx, key, ttl)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("store: retry number %s: %w", jobID, err)
	}
	return n.Val(), nil
}

// LinkRetry records that newJobID re-runs jobID (from DLQ entry entryID),
// on both jobs. The two jobs live in different shards, so these are two
// writes; each is idempotent.
func (s *Store) LinkRetry(ctx context.Context, jobID, newJobID, entryID string) error {
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	ttl := s.linkTTL()
	for _, w := range []struct {
		key    string
		fields []interface{}
	}{
		{s.keys.Links(newJobID), []interface{}{"retry_of", jobID, "dlq_entry", entryID}},
		{s.keys.Links(jobID), []interface{}{"retried_as:" + newJobID, now}},
	} {
		pipe := s.rdb.TxPipeline()
		pipe.HSet(ctx, w.key, w.fields...)
		if ttl > 0 {
			pipe.Expire(ctx, w.key, ttl)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("store: link retry %s → %s: %w", jobID, newJobID, err)
		}
	}
	return nil
}

// Links returns a job's retry links (empty if it has none).
func (s *Store) Links(ctx context.Context, jobID string) (JobLinks, error) {
	f, err := s.rdb.HGetAll(ctx, s.keys.Links(jobID)).Result()
	if err != nil {
		return JobLinks{}, fmt.Errorf("store: links %s: %w", jobID, err)
	}
	l := JobLinks{RetryOf: f["retry_of"], DLQEntry: f["dlq_entry"]}
	type retry struct {
		id string
		at int64
	}
	var rs []retry
	for k, v := range f {
		if id, ok := strings.CutPrefix(k, "retried_as:"); ok {
			at, _ := strconv.ParseInt(v, 10, 64)
			rs = append(rs, retry{id, at})
		}
	}
	// Oldest first; ids break ties so the order is stable.
	slices.SortFunc(rs, func(a, b retry) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	for _, r := range rs {
		l.Retries = append(l.Retries, r.id)
	}
	return l, nil
}

// DLQRetried is the retry mark of a DLQ entry: the id of the job it was
// retried as. It lives beside the stream, not in it, because stream entries
// cannot be updated.
func (k *Keys) DLQRetried(entryID string) string { return k.prefix + "dlq:retried:" + entryID }

// Links is the hash of a job's retry links (retry_of, dlq_entry,
// retried_as:<job_id>, retry_seq), in the job's shard.
func (k *Keys) Links(jobID string) string { return k.tags[Shard(jobID)] + "links:" + jobID }

// Trace is the list of a job's mailbox trace entries (package jobtrace),
// oldest first, in the job's shard so it expires alongside the record.
func (k *Keys) Trace(jobID string) string { return k.tags[Shard(jobID)] + "trace:" + jobID }
