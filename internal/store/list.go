package store

import (
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

// Listing bounds.
const (
	// ListLimitDefault is the page size when a query names none.
	ListLimitDefault = 50
	// ListLimitMax caps one page. A page reads up to this many index entries
	// from each of the Shards indexes, so 1000 keeps the worst page near
	// 64k entries — one pipeline of a few megabytes.
	ListLimitMax = 1000
	// listScanPages bounds how many index pages one tenant-filtered query
	// reads before it returns what it found with a cursor: a tenant with
	// few jobs among many must not turn one request into a full scan.
	listScanPages = 8
	// listMaxTies bounds how many already-listed jobs sharing one update
	// millisecond a cursor skips by re-reading them. Past it the cursor
	// moves strictly below that millisecond, so a listing of more than this
	// many jobs updated in the same millisecond may leave some of them out:
	// a price paid only by bulk transitions, never by a crafted cursor.
	listMaxTies = ListLimitMax
)

// ErrBadCursor is returned for a cursor this store did not produce.
var ErrBadCursor = errors.New("store: invalid list cursor")

// ListQuery selects jobs by state, newest update first.
type ListQuery struct {
	State jobstate.State
	// Tenant, when set, keeps only that tenant's jobs.
	Tenant string
	// Limit is the page size (default ListLimitDefault, at most ListLimitMax).
	Limit int
	// Cursor continues a previous page ("" = from the newest).
	Cursor string
	// Since, when set, keeps the jobs created at or after it. No job is
	// updated before it is created, so the scan, which runs newest update
	// first, ends at the first index entry updated before Since.
	Since time.Time
	// Match, when set, keeps only the jobs it accepts (the caller's
	// filters: topic, worker, labels, ...). It sees each record the scan
	// reads, within the scan budget (listScanPages index pages), so a
	// filter that matches few jobs returns short pages with a cursor.
	Match func(*JobSummary) bool
}

// keeps reports whether the listing q keeps sum.
func (q *ListQuery) keeps(sum *JobSummary) bool {
	switch {
	case sum == nil, q.Tenant != "" && sum.Tenant != q.Tenant:
		return false
	case !q.Since.IsZero() && sum.Created.Before(q.Since):
		return false
	}
	return q.Match == nil || q.Match(sum)
}

// pastSince reports whether an index entry scored score (its update, unix
// ms) and every entry after it are updated, and so created, before Since.
func (q *ListQuery) pastSince(score int64) bool {
	return !q.Since.IsZero() && score < q.Since.UnixMilli()
}

// JobSummary is one line of a job listing: the few fields a table shows,
// read from the job's record (not the index), so State is the job's state
// when it was read — a job may have moved since it was indexed.
type JobSummary struct {
	ID      string
	State   jobstate.State
	Topic   string
	Tenant  string
	Reason  jobstate.Reason
	Worker  string
	Updated time.Time
	Created time.Time
	// Attempts counts the job's dispatches so far.
	Attempts int
	// Request is the job's stored CAP JobRequest (protobuf), for filters and
	// views that need more than these fields (its labels).
	Request []byte
}

// JobPage is one page of a listing; Next is "" after the last page.
type JobPage struct {
	Jobs []JobSummary
	Next string
}

// cursor marks where a page ended in the global order (update time
// descending, then job id descending — the order ZREVRANGEBYSCORE gives
// within one shard). ties counts the jobs already returned whose score
// equals score; no shard can hold more of them than that, so fetching
// limit+ties entries from each shard is always enough to skip them.
// ties == 0 (and no id) means "strictly below score".
type cursor struct {
	score int64
	ties  int
	id    string
}

func (c cursor) String() string {
	return strconv.FormatInt(c.score, 10) + ":" + strconv.Itoa(c.ties) + ":" + c.id
}

func parseCursor(s string) (cursor, error) {
	// The id comes last: job ids may contain ':'.
	p := strings.SplitN(s, ":", 3)
	if len(p) != 3 {
		return cursor{}, ErrBadCursor
	}
	score, err1 := strconv.ParseInt(p[0], 10, 64)
	ties, err2 := strconv.Atoi(p[1])
	if err1 != nil || err2 != nil || ties < 0 || ties > listMaxTies || (ties == 0) != (p[2] == "") {
		return cursor{}, ErrBadCursor
	}
	return cursor{score: score, ties: ties, id: p[2]}, nil
}

// after reports whether an index entry comes after c in the global order.
func (c cursor) after(score int64, id string) bool {
	return score < c.score || score == c.score && id < c.id
}

// ListJobs returns one page of the jobs indexed under q.State across every
// shard, newest update first. It reads the shard indexes in one pipeline
// and the matching records in a second; an index entry whose record has
// expired is skipped. Listing is not a snapshot: a job that changes state
// between pages may be missed or shown twice.
func (s *Store) ListJobs(ctx context.Context, q ListQuery) (JobPage, error) {
	if !q.State.Valid() {
		return JobPage{}, fmt.Errorf("store: list: unknown state %q", q.State)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = ListLimitDefault
	}
	return s.listPages(ctx, q, min(limit, ListLimitMax), func(cur *cursor, limit int) ([]indexEntry, bool, error) {
		return s.indexPage(ctx, q.State, cur, limit)
	})
}

// listPages fills one page of up to limit jobs from the index pages page
// reads, from q.Cursor on, skipping expired records and other tenants'
// jobs, within the scan budget (listScanPages).
func (s *Store) listPages(ctx context.Context, q ListQuery, limit int,
	page func(cur *cursor, limit int) ([]indexEntry, bool, error)) (JobPage, error) {
	var cur *cursor
	if q.Cursor != "" {
		c, err := parseCursor(q.Cursor)
		if err != nil {
			return JobPage{}, err
		}
		cur = &c
	}
	var out []JobSummary
	for n := 0; n < listScanPages; n++ {
		entries, more, err := page(cur, limit)
		if err != nil {
			return JobPage{}, err
		}
		if len(entries) == 0 {
			return JobPage{Jobs: out}, nil
		}
		sums, err := s.summaries(ctx, entries)
		if err != nil {
			return JobPage{}, err
		}
		for i, sum := range sums {
			if !q.keeps(sum) {
				continue
			}
			out = append(out, *sum)
			if len(out) == limit {
				// Stop right after this entry so the next page starts with
				// the one that follows it.
				c := cursorAt(entries[:i+1], cur)
				return JobPage{Jobs: out, Next: nextIf(c, more || i+1 < len(entries))}, nil
			}
		}
		c := cursorAt(entries, cur)
		cur = &c
		if !more || q.pastSince(entries[len(entries)-1].score) {
			return JobPage{Jobs: out}, nil
		}
	}
	// The scan budget ran out before the page filled: hand back what was
	// found and where to go on.
	return JobPage{Jobs: out, Next: cur.String()}, nil
}

func nextIf(c cursor, more bool) string {
	if !more {
		return ""
	}
	return c.String()
}

// indexEntry is one member of a state index.
type indexEntry struct {
	id    string
	score int64
}

// cursorAt returns the cursor just after the last of entries (which are in
// global order and continue from prev).
func cursorAt(entries []indexEntry, prev *cursor) cursor {
	last := entries[len(entries)-1]
	ties := 0
	for i := len(entries) - 1; i >= 0 && entries[i].score == last.score; i-- {
		ties++
	}
	if prev != nil && prev.score == last.score {
		ties += prev.ties
	}
	if ties > listMaxTies {
		return cursor{score: last.score}
	}
	return cursor{score: last.score, ties: ties, id: last.id}
}

// indexPage returns the next (up to) limit index entries after cur in the
// global order, merged from every shard, and whether more may follow.
func (s *Store) indexPage(ctx context.Context, state jobstate.State, cur *cursor, limit int) ([]indexEntry, bool, error) {
	return s.statesIndexPage(ctx, []jobstate.State{state}, cur, limit)
}

// sortEntries orders entries by score, then id, both descending.
func sortEntries(es []indexEntry) {
	slices.SortFunc(es, func(a, b indexEntry) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		case a.id > b.id:
			return -1
		case a.id < b.id:
			return 1
		}
		return 0
	})
}

// summaryFields are the record fields a JobSummary reads.
// The last, fieldPacked, holds topic and tenant for a record created
// without them (see packed.go).
var summaryFields = []string{"s", "topic", "tenant", "reason", "worker", "updated", "created", "attempts", "req", fieldPacked}

// summaries reads the summary fields of every entry's record in one
// pipeline; a nil element means the record is gone.
func (s *Store) summaries(ctx context.Context, entries []indexEntry) ([]*JobSummary, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(entries))
	for i, e := range entries {
		cmds[i] = pipe.HMGet(ctx, s.keys.Job(e.id), summaryFields...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("store: list records: %w", err)
	}
	out := make([]*JobSummary, len(entries))
	for i, c := range cmds {
		v := c.Val()
		str := func(k int) string { s, _ := v[k].(string); return s }
		if len(v) != len(summaryFields) || str(0) == "" {
			continue
		}
		out[i] = &JobSummary{ID: entries[i].id, State: jobstate.State(str(0)), Topic: str(1), Tenant: str(2),
			Reason: jobstate.Reason(str(3)), Worker: str(4), Created: parseMillis(str(6))}
		if pk := str(9); pk != "" {
			if _, plain := v[1].(string); !plain {
				out[i].Topic = unpacked(pk, "topic")
			}
			if _, plain := v[2].(string); !plain {
				out[i].Tenant = unpacked(pk, "tenant")
			}
		}
		out[i].Updated = updatedAt(str(5), out[i].Created)
		out[i].Attempts, _ = strconv.Atoi(str(7))
		if req := str(8); req != "" {
			out[i].Request = []byte(req)
		}
	}
	return out, nil
}

// CountStates returns how many jobs each of states (default: every state)
// holds in its indexes across all shards, in one pipeline. Terminal counts
// include jobs kept for the retention period.
func (s *Store) CountStates(ctx context.Context, states ...jobstate.State) (map[jobstate.State]int64, error) {
	if len(states) == 0 {
		states = jobstate.AllStates
	}
	pipe := s.rdb.Pipeline()
	cmds := make(map[jobstate.State][]*redis.IntCmd, len(states))
	for _, st := range states {
		cs := make([]*redis.IntCmd, Shards)
		for i := 0; i < Shards; i++ {
			cs[i] = pipe.ZCard(ctx, s.keys.Index(i, string(st)))
		}
		cmds[st] = cs
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("store: count states: %w", err)
	}
	out := make(map[jobstate.State]int64, len(cmds))
	for st, cs := range cmds {
		var n int64
		for _, c := range cs {
			n += c.Val()
		}
		out[st] = n
	}
	return out, nil
}

// eachJob runs read for every job in one pipeline (cluster-safe: one key a
// command) and returns the replies in order; a missing key is an empty
// reply (redis.Nil), not an error.
func (s *Store) eachJob(ctx context.Context, what string, jobIDs []string,
	read func(pipe redis.Pipeliner, jobID string) *redis.StringCmd) ([]*redis.StringCmd, error) {
	if len(jobIDs) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(jobIDs))
	for i, id := range jobIDs {
		cmds[i] = read(pipe, id)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	return cmds, nil
}

// recordField returns field of each job that has a record, in one pipeline
// (jobs without a record are left out).
func (s *Store) recordField(ctx context.Context, what, field string, jobIDs []string) (map[string]string, error) {
	cmds, err := s.eachJob(ctx, what, jobIDs, func(pipe redis.Pipeliner, id string) *redis.StringCmd {
		return pipe.HGet(ctx, s.keys.Job(id), field)
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(jobIDs))
	for i, c := range cmds {
		if v, err := c.Result(); err == nil {
			out[jobIDs[i]] = v
		}
	}
	return out, nil
}

// States returns the state recorded for each job that has a record, in one
// pipeline (jobs without a record are left out).
func (s *Store) States(ctx context.Context, jobIDs []string) (map[string]jobstate.State, error) {
	fields, err := s.recordField(ctx, "states", "s", jobIDs)
	if err != nil {
		return nil, err
	}
	out := make(map[string]jobstate.State, len(fields))
	for id, v := range fields {
		out[id] = jobstate.State(v)
	}
	return out, nil
}

// Tenants returns the tenant recorded on each job that has a record, in
// one pipeline (jobs without a record are left out).
func (s *Store) Tenants(ctx context.Context, jobIDs []string) (map[string]string, error) {
	cmds, err := s.eachJobFields(ctx, "tenants", jobIDs, "tenant", fieldPacked)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(jobIDs))
	for i, c := range cmds {
		v := c.Val()
		if len(v) != 2 {
			continue
		}
		if t, ok := v[0].(string); ok {
			out[jobIDs[i]] = t
		} else if pk, ok := v[1].(string); ok {
			out[jobIDs[i]] = unpacked(pk, "tenant")
		}
	}
	return out, nil
}

// eachJobFields reads fields of each job's record, in one pipeline of
// HMGETs, in order.
func (s *Store) eachJobFields(ctx context.Context, what string, jobIDs []string, fields ...string) ([]*redis.SliceCmd, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(jobIDs))
	for i, id := range jobIDs {
		cmds[i] = pipe.HMGet(ctx, s.keys.Job(id), fields...)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	return cmds, nil
}

// LockHolders returns the lock value of each job ("" when unlocked), in
// order, in one pipeline of GETs.
func (s *Store) LockHolders(ctx context.Context, jobIDs []string) ([]string, error) {
	cmds, err := s.eachJob(ctx, "lock holders", jobIDs, func(pipe redis.Pipeliner, id string) *redis.StringCmd {
		return pipe.Get(ctx, s.keys.Lock(id))
	})
	if err != nil {
		return nil, err
	}
	out := make([]string, len(jobIDs))
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return out, nil
}

// LockRemaining is how long the job's lock has left: 0 when there is none;
// for a parked lock, which has no TTL of its own, what its node's lease in
// the job's shard has left (0 when the lease has lapsed: the lock is free
// to adopt); -1 for a lock with no TTL that is not parked. (go-redis
// passes PTTL's -1 and -2 through unscaled.)
func (s *Store) LockRemaining(ctx context.Context, jobID string) (time.Duration, error) {
	lock, pttl, err := s.readLock(ctx, jobID)
	if err != nil {
		return 0, err
	}
	return s.remaining(ctx, jobID, lock, pttl)
}

// readLock reads jobID's lock value ("" for none) and its PTTL in one
// round trip.
func (s *Store) readLock(ctx context.Context, jobID string) (string, time.Duration, error) {
	pipe := s.rdb.Pipeline()
	val := pipe.Get(ctx, s.keys.Lock(jobID))
	ttl := pipe.PTTL(ctx, s.keys.Lock(jobID))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return "", 0, fmt.Errorf("store: lock read: %w", err)
	}
	return val.Val(), ttl.Val(), nil
}

// remaining is LockRemaining for a lock read as lock with PTTL pttl.
func (s *Store) remaining(ctx context.Context, jobID, lock string, pttl time.Duration) (time.Duration, error) {
	switch {
	case pttl == -1:
		node, rest, _ := strings.Cut(lock, "|")
		if !strings.HasSuffix(rest, "|p") {
			return -1, nil
		}
		lease, err := s.rdb.PTTL(ctx, s.keys.Alive(Shard(jobID), node)).Result()
		if err != nil {
			return 0, fmt.Errorf("store: node lease ttl: %w", err)
		}
		if lease < 0 {
			return 0, nil
		}
		return lease, nil
	case pttl < 0:
		return 0, nil
	}
	return pttl, nil
}

// OwnerWait is how long an event for jobID should wait before it is offered
// again when the node holding the job's lock did not answer on NATS. While
// the owner's node lease (Keys.Nodes, renewed every LockTTL/3 through
// Redis) is fresh, the owner may be alive and only cut off from NATS for a
// moment — a reconnect, a NATS server restarting — or dead since its last
// renewal: the event waits until the lease would go stale, and is then
// offered again (to a live owner, back on NATS by then, or to find the
// lease stale). Once the lease is stale or missing the owner is taken for
// dead, and only its lock's lapse frees the job: LockRemaining. (Waiting
// for the lapse at once held every result forwarded to a node that lost
// NATS for a second for up to a lock TTL: past a 45 s running deadline in
// faults/TestNATSClusterR3. Retrying every second or two instead is not
// what JetStream does: its redelivery of short naks drifts to its BackOff,
// and a dead owner's results were taken 18–25 s past the lapse.) The
// owner's clock wrote the lease's time; a clock skewed by more than
// ownerLeaseSlack only moves the event between those two waits.
func (s *Store) OwnerWait(ctx context.Context, jobID string) (time.Duration, error) {
	lock, pttl, err := s.readLock(ctx, jobID)
	if err != nil {
		return 0, err
	}
	if owner, _, _ := strings.Cut(lock, "|"); owner != "" {
		renewed, err := s.rdb.ZScore(ctx, s.keys.Nodes(), owner).Result()
		if err == nil {
			if stale := time.Until(time.UnixMilli(int64(renewed)).Add(s.cfg.LockTTL/3 + ownerLeaseSlack)); stale > 0 {
				return stale, nil
			}
		}
	}
	return s.remaining(ctx, jobID, lock, pttl)
}

// ownerLeaseSlack is how much older than its renewal period an owner's
// node lease may be and still count as renewed lately (OwnerWait).
const ownerLeaseSlack = 2 * time.Second

// ListRecent returns one page of the newest jobs whatever their state
// (q.State is ignored): ListJobs over every state's index at once, in the
// same order, with the same cursors, tenant filter and scan budget. A page
// reads the indexes of every state, so its size is capped at
// ListLimitMax/len(jobstate.AllStates) to keep a page's reads within a
// one-state page's bound.
func (s *Store) ListRecent(ctx context.Context, q ListQuery) (JobPage, error) {
	limit := q.Limit
	if limit <= 0 {
		limit = ListLimitDefault
	}
	return s.listPages(ctx, q, min(limit, ListLimitMax/len(jobstate.AllStates)), func(cur *cursor, limit int) ([]indexEntry, bool, error) {
		return s.statesIndexPage(ctx, jobstate.AllStates, cur, limit)
	})
}

// statesIndexPage is indexPage over the indexes of several states, in one
// pipeline. A job is in one state's index at a time, but the pipeline is
// not a snapshot: a job that moved while it ran may be read in both
// indexes, and only its newer entry is kept.
func (s *Store) statesIndexPage(ctx context.Context, states []jobstate.State, cur *cursor, limit int) ([]indexEntry, bool, error) {
	hi, fetch := "+inf", int64(limit)
	if cur != nil {
		hi = strconv.FormatInt(cur.score, 10)
		if cur.ties == 0 {
			hi = "(" + hi
		}
		fetch += int64(cur.ties)
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.ZSliceCmd, 0, len(states)*Shards)
	for _, st := range states {
		for i := 0; i < Shards; i++ {
			cmds = append(cmds, pipe.ZRevRangeByScoreWithScores(ctx, s.keys.Index(i, string(st)),
				&redis.ZRangeBy{Max: hi, Min: "-inf", Count: fetch}))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, false, fmt.Errorf("store: list every state: %w", err)
	}
	var all []indexEntry
	more := false
	for _, c := range cmds {
		zs := c.Val()
		if int64(len(zs)) == fetch {
			more = true // this index may hold more past what was fetched
		}
		for _, z := range zs {
			id, _ := z.Member.(string)
			e := indexEntry{id: id, score: int64(z.Score)}
			if cur == nil || cur.after(e.score, e.id) {
				all = append(all, e)
			}
		}
	}
	sortEntries(all)
	seen := make(map[string]bool, len(all))
	all = slices.DeleteFunc(all, func(e indexEntry) bool {
		dup := seen[e.id]
		seen[e.id] = true
		return dup
	})
	if len(all) > limit {
		all, more = all[:limit], true
	}
	return all, more, nil
}
