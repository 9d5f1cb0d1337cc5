package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// DueJobs returns, over every shard, up to perShard job ids per shard whose
// due time is at or before cutoff, and moves each to next so it is offered
// again only if nobody acts on it. One pipeline for all shards.
func (s *Store) DueJobs(ctx context.Context, cutoff, next time.Time, perShard int) ([]string, error) {
	return s.popDue(ctx, s.keys.Due, cutoff, next, perShard)
}

// Orphan is a job whose owner stopped renewing its lease, and when the
// owner's lock lapsed: the lease's deadline minus one lock TTL, as leases run
// two lock TTLs past each renewal. For a lease offered before (an adoption
// that did not take), the deadline is the one the earlier offer set, and
// LapsedAt comes out later than the real lapse.
type Orphan struct {
	JobID    string
	LapsedAt time.Time
}

// ExpiredLeases returns, over every shard, up to perShard jobs whose owner
// stopped renewing their lease before cutoff (the owner died), and moves
// each lease to next so a job is offered again only if nobody adopts it.
// A lease is a member of the shard's due set (Keys.LeaseMember), or, one
// written by a node of the version before, of its lease set (Keys.Leases).
// One pipeline for all shards.
func (s *Store) ExpiredLeases(ctx context.Context, cutoff, next time.Time, perShard int) ([]Orphan, error) {
	cmds, err := s.runShards(ctx, true, s.keys.Due, cutoff, next, perShard)
	if err != nil {
		return nil, err
	}
	var out []Orphan
	for _, c := range cmds {
		kv, err := c.StringSlice()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("store: lease scan: %w", err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			o := Orphan{JobID: kv[i]}
			if score, err := strconv.ParseFloat(kv[i+1], 64); err == nil && score > 0 {
				lapsed := time.UnixMilli(int64(score)).Add(-s.cfg.LockTTL)
				if lapsed.Before(cutoff) {
					o.LapsedAt = lapsed
				}
			}
			out = append(out, o)
		}
	}
	return out, nil
}

// popDue runs dueScript over the sorted set key(shard) of every shard.
func (s *Store) popDue(ctx context.Context, key func(shard int) string, cutoff, next time.Time, perShard int) ([]string, error) {
	cmds, err := s.runShards(ctx, false, key, cutoff, next, perShard)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range cmds {
		ids, err := c.StringSlice()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("store: due scan: %w", err)
		}
		out = append(out, ids...)
	}
	return out, nil
}

// runShards runs dueScript (dueScoresScript if withScores, with the
// shard's lease set as its second key) over the sorted set key(shard) of
// every shard in one pipeline, loading the scripts if Redis lost them.
func (s *Store) runShards(ctx context.Context, withScores bool, key func(shard int) string,
	cutoff, next time.Time, perShard int) ([]*redis.Cmd, error) {
	items, err := s.sendScripts(ctx, Shards, func(pipe redis.Pipeliner, i int) []redis.Cmder {
		return []redis.Cmder{evalSha(ctx, pipe, dueCall{withScores: withScores, setKey: key(i), leasesKey: s.keys.Leases(i),
			cutoffMs: cutoff.UnixMilli(), limit: perShard, laterMs: next.UnixMilli()})}
	})
	if err != nil {
		return nil, err
	}
	cmds := make([]*redis.Cmd, Shards)
	for i, it := range items {
		cmds[i] = it.cmds[0].(*redis.Cmd)
	}
	return cmds, nil
}

// DueAt returns the due time of a job, or zero if it has none.
func (s *Store) DueAt(ctx context.Context, jobID string) (time.Time, error) {
	ms, err := s.rdb.ZScore(ctx, s.keys.Due(Shard(jobID)), jobID).Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(int64(ms)), nil
}

// Decision is a human's answer to an approval request.
type Decision = jobstate.Decision

const (
	DecisionApproved = jobstate.DecisionApproved
	DecisionRejected = jobstate.DecisionRejected
)

// Approval errors.
var (
	ErrNotAwaitingApproval = errors.New("store: job is not waiting for approval")
	ErrHashMismatch        = errors.New("store: job hash does not match the one approved")
	// ErrAlreadyDecided: the job has a decision already; the first one
	// stands until a node acts on it.
	ErrAlreadyDecided = errors.New("store: job already has a decision")
	// ErrNoJobHash: the job has no recorded hash, so no decision could
	// say what it approved.
	ErrNoJobHash = errors.New("store: job has no recorded hash")
)

// Decide records a human decision on a job in APPROVAL_REQUIRED and makes
// it due now. hash, when set, must equal the job hash recorded when approval
// was requested (so an approver's view of the job is the job that runs);
// the recorded hash is stored with the decision, and a job without one is
// refused (ErrNoJobHash). The first decision stands: another, before a
// node has acted on the first, is ErrAlreadyDecided.
func (s *Store) Decide(ctx context.Context, jobID string, d Decision, by, reason, hash string) error {
	v, err := runScript(ctx, s.rdb, approveCall{jobKey: s.keys.Job(jobID), dueKey: s.keys.Due(Shard(jobID)),
		decision: string(d), by: by, reason: reason, hash: hash, nowMs: time.Now().UnixMilli(), jobID: jobID}).StringSlice()
	if err != nil {
		return fmt.Errorf("store: decide %s: %w", jobID, err)
	}
	switch v[0] {
	case "OK":
		return nil
	case "NOTFOUND":
		return ErrNotFound
	case "STATE":
		return fmt.Errorf("%w (state %s)", ErrNotAwaitingApproval, jobstate.State(v[1]))
	case "HASH":
		return fmt.Errorf("%w (recorded %s)", ErrHashMismatch, v[1])
	case "DECIDED":
		return fmt.Errorf("%w (%s)", ErrAlreadyDecided, v[1])
	case "NOHASH":
		return ErrNoJobHash
	}
	return fmt.Errorf("store: decide %s: unexpected reply %v", jobID, v)
}

// Retention trim bounds: ids read per terminal-state index and pass, and
// passes per TrimTerminal call (a backlog beyond them waits for the next
// call).
const (
	trimBatch  = 500
	trimRounds = 20
)

// TrimTerminal deletes the jobs that ended before before: their records
// (with their histories) and their entries in every shard's terminal-state
// indexes. A terminal write sets no expiry on the record (an EXPIRE per job
// cost Redis a command on the hot path); the index entry, scored with the
// job's terminal time, is how the trim finds it. Each pass reads up to
// trimBatch ids per index (one pipeline), then deletes them (a script per
// index with ids, one pipeline); it returns how many it deleted.
func (s *Store) TrimTerminal(ctx context.Context, before time.Time) (int64, error) {
	var terminal []string
	for _, st := range jobstate.AllStates {
		if st.Terminal() {
			terminal = append(terminal, string(st))
		}
	}
	maxScore := strconv.FormatInt(before.UnixMilli(), 10)
	var n int64
	for round := 0; round < trimRounds; round++ {
		pipe := s.rdb.Pipeline()
		reads := make([]*redis.StringSliceCmd, 0, Shards*len(terminal))
		for sh := 0; sh < Shards; sh++ {
			for _, st := range terminal {
				reads = append(reads, pipe.ZRangeByScore(ctx, s.keys.Index(sh, st),
					&redis.ZRangeBy{Min: "-inf", Max: maxScore, Count: trimBatch}))
			}
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return n, fmt.Errorf("store: trim: read: %w", err)
		}
		var calls []trimCall
		full := false
		for i, r := range reads {
			ids := r.Val()
			if len(ids) == 0 {
				continue
			}
			full = full || len(ids) >= trimBatch
			sh, st := i/len(terminal), terminal[i%len(terminal)]
			c := trimCall{indexKey: s.keys.Index(sh, st)}
			for _, id := range ids {
				if Shard(id) == sh { // else not a job of this shard: left alone
					c.jobIDs = append(c.jobIDs, id)
					c.jobKeys = append(c.jobKeys, s.keys.Job(id))
				}
			}
			if len(c.jobIDs) > 0 {
				calls = append(calls, c)
			}
		}
		if len(calls) == 0 {
			return n, nil
		}
		items, err := s.sendScripts(ctx, len(calls), func(pipe redis.Pipeliner, i int) []redis.Cmder {
			return []redis.Cmder{evalSha(ctx, pipe, calls[i])}
		})
		if err != nil {
			return n, fmt.Errorf("store: trim: %w", err)
		}
		for _, it := range items {
			v, err := it.cmds[0].(*redis.Cmd).Int64()
			if err != nil {
				return n, fmt.Errorf("store: trim: %w", err)
			}
			n += v
		}
		if !full {
			return n, nil
		}
	}
	return n, nil
}

// Retention returns how long terminal jobs are kept (≤ 0: forever).
func (s *Store) Retention() time.Duration { return s.cfg.Retention }

// DLQRetention returns how long DLQ entries are kept (≤ 0: no age limit).
func (s *Store) DLQRetention() time.Duration { return s.cfg.DLQRetention }

// TrimDLQ drops the DLQ entries written before before and returns how
// many. A stream id starts with its entry's time in milliseconds, so one
// XTRIM MINID does it; the running byte totals the budget reads stay
// right, as they count from whichever entry is oldest.
func (s *Store) TrimDLQ(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.rdb.XTrimMinID(ctx, s.keys.DLQ(), strconv.FormatInt(before.UnixMilli(), 10)+"-0").Result()
	if err != nil {
		return 0, fmt.Errorf("store: dlq trim: %w", err)
	}
	return n, nil
}

// RepairTenantSlots gives back tenant concurrency slots held by jobs that
// are no longer DISPATCHED or RUNNING (a node died between finishing a job
// and releasing its slot). Only slots older than minAge are considered, so
// a job admitted a moment ago and not yet dispatched keeps its slot. At most
// perKey slots per tenant are checked per call. The tenants are read from
// Keys.Tenants (every admission records its tenant there), not by scanning
// the keyspace, so the cost follows the number of tenants, not of keys.
// A tenant whose slots or job states cannot all be read (a Redis timeout)
// keeps every slot: the repair goes on with the next tenant and returns the
// read error at the end, with the slots it did give back.
func (s *Store) RepairTenantSlots(ctx context.Context, minAge time.Duration, perKey int64) (int, error) {
	removed := 0
	seen := map[string]bool{}
	var tenantKeys []string
	var cursor uint64
	for {
		keys, next, err := s.rdb.SScan(ctx, s.keys.Tenants(), cursor, "", 1000).Result()
		if err != nil {
			return 0, fmt.Errorf("store: repair tenant slots: %w", err)
		}
		for _, key := range keys { // SSCAN may return a member twice
			if !seen[key] {
				seen[key] = true
				tenantKeys = append(tenantKeys, key)
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	cutoff := strconv.FormatInt(time.Now().Add(-minAge).UnixMilli(), 10)
	var readErr error
	for _, key := range tenantKeys {
		ids, err := s.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: cutoff, Count: perKey}).Result()
		if err != nil {
			readErr = err
			continue
		}
		if len(ids) == 0 {
			continue
		}
		stale, err := s.staleSlots(ctx, ids)
		if err != nil {
			// A state not read is not "not running": this key is left
			// as it is (the next repair looks again).
			readErr = err
			continue
		}
		if len(stale) > 0 {
			if err := s.rdb.ZRem(ctx, key, stale...).Err(); err != nil {
				return removed, fmt.Errorf("store: repair tenant slots: %w", err)
			}
			removed += len(stale)
		}
	}
	if readErr != nil {
		return removed, fmt.Errorf("store: repair tenant slots: a read failed, its tenant's slots kept: %w", readErr)
	}
	return removed, nil
}

// staleSlots returns those of ids whose job is not DISPATCHED or RUNNING
// (a job with no record any more included), or an error if any state could
// not be read.
func (s *Store) staleSlots(ctx context.Context, ids []string) ([]interface{}, error) {
	pipe := s.rdb.Pipeline()
	states := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		states[i] = pipe.HGet(ctx, s.keys.Job(id), "s")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var stale []interface{}
	for i, id := range ids {
		st, err := states[i].Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		if state := jobstate.State(st); state != jobstate.StateDispatched && state != jobstate.StateRunning {
			stale = append(stale, id)
		}
	}
	return stale, nil
}
