package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// Defaults for Config fields left zero.
const (
	// LockTTLDefault is how long a job lock lives without renewal. The renewer
	// extends it every LockTTL/3, so two missed renewals still leave it held.
	LockTTLDefault = 60 * time.Second
	// RetentionDefault is how long a terminal job's record and history are kept.
	RetentionDefault = 24 * time.Hour
	// DLQMaxLenDefault bounds the DLQ stream (approximate trimming).
	DLQMaxLenDefault = 100_000
	// RescueAfterDefault: a job still PENDING this long after it was created
	// (its actor or node died before it scheduled) is woken by the due poller.
	RescueAfterDefault = 2 * time.Minute
)

// ErrNotFound is returned when a job has no record.
var ErrNotFound = errors.New("store: job not found")

// Config configures a Store.
type Config struct {
	// Prefix starts every key (default "troupe:"). Tests use one per test.
	Prefix string
	// LockTTL is the job lock's time to live (default LockTTLDefault).
	LockTTL time.Duration
	// Retention is how long terminal jobs stay readable: their records,
	// histories, and the retry marks and links of DLQ retries (default
	// RetentionDefault; <0 keeps them forever).
	Retention time.Duration
	// DLQRetention is how long a DLQ entry is kept: the due poller drops
	// older ones (TrimDLQ). Zero or negative: no age limit, DLQMaxBytes and
	// DLQMaxLen alone bound the stream.
	DLQRetention time.Duration
	// DLQMaxLen bounds the DLQ stream (default DLQMaxLenDefault).
	DLQMaxLen int64
	// DLQMaxBytes bounds the bytes of the DLQ stream's entries (default
	// DLQMaxBytesDefault); the oldest entries go first.
	DLQMaxBytes int64
	// RescueAfter is when a new job is due if nothing else sets its due
	// time first (default RescueAfterDefault).
	RescueAfter time.Duration
}

// Store is Troupe's Redis state. It is safe for concurrent use.
type Store struct {
	rdb  redis.UniversalClient
	keys *Keys
	cfg  Config
	// tenants holds the TenantActive keys this process has recorded in
	// Keys.Tenants (written once per key and process, on first admission).
	tenants sync.Map
	// renewers are the lock renewers of this store (NewLockRenewer): the
	// Writer tells them of the writes that give a lock up (releasing.go).
	renewers atomic.Pointer[[]*LockRenewer]
	// cluster: rdb is a Redis Cluster client, or a plain client of a
	// cluster node (probeMulti reads INFO's redis_mode), so one script call
	// may name the keys of one slot only, and the Writer groups jobs per
	// shard (Writer.units).
	cluster bool
	// single: the server does not keep a failed redis.call to its job in a
	// multi-job call (probeMulti; the embedded store's Lua does not), so
	// the Writer sends every op as a call of its own.
	single bool
}

// New returns a Store over rdb.
func New(rdb redis.UniversalClient, cfg Config) *Store {
	if cfg.Prefix == "" {
		cfg.Prefix = "troupe:"
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = LockTTLDefault
	}
	if cfg.Retention == 0 {
		cfg.Retention = RetentionDefault
	}
	if cfg.DLQMaxLen <= 0 {
		cfg.DLQMaxLen = DLQMaxLenDefault
	}
	if cfg.DLQMaxBytes <= 0 {
		cfg.DLQMaxBytes = DLQMaxBytesDefault
	}
	if cfg.RescueAfter <= 0 {
		cfg.RescueAfter = RescueAfterDefault
	}
	_, cluster := rdb.(*redis.ClusterClient)
	return &Store{rdb: rdb, keys: NewKeys(cfg.Prefix), cfg: cfg, cluster: cluster}
}

// Keys returns the key namer.
func (s *Store) Keys() *Keys { return s.keys }

// Client returns the Redis client.
func (s *Store) Client() redis.UniversalClient { return s.rdb }

// LockTTL returns the configured lock TTL.
func (s *Store) LockTTL() time.Duration { return s.cfg.LockTTL }

// LoadScripts loads every Lua script into Redis's script cache, so pipelines
// can use EVALSHA, and decides how the Writer groups its calls
// (probeMulti). It is called at start, before the Writer runs; a NOSCRIPT
// later (a Redis restart or SCRIPT FLUSH) reloads the scripts only
// (loadScripts): the Writer's goroutines read what the probe decided, and an
// INFO failing while Redis restarts must not turn grouping off.
func (s *Store) LoadScripts(ctx context.Context) error {
	if err := s.loadScripts(ctx); err != nil {
		return err
	}
	return s.probeMulti(ctx)
}

func (s *Store) loadScripts(ctx context.Context) error {
	for _, sc := range append(allScripts[:len(allScripts):len(allScripts)], multiScripts...) {
		if err := sc.Load(ctx, s.rdb).Err(); err != nil {
			return fmt.Errorf("store: load script: %w", err)
		}
	}
	return nil
}

// probeMulti decides whether the Writer groups jobs into multi-job calls
// (lua/lib/multi.lua): only on a Redis server (INFO server names its
// redis_version) whose scripts decode packed arguments as Redis's cmsgpack
// does (packedArgsDecode). The embedded store's Lua mis-runs a multi-job call in
// which one job's redis.call failed — the jobs after it failed too — so
// there every op is a call of its own (single). A server in cluster mode
// sets cluster, whatever the client.
func (s *Store) probeMulti(ctx context.Context) error {
	info, err := s.rdb.Info(ctx, "server").Result()
	s.single = err != nil || !strings.Contains(info, "redis_version:")
	if !s.single && !packedArgsDecode(ctx, s.rdb) {
		// A Redis-protocol server without Redis's cmsgpack cannot read a
		// multi-job call's packed arguments (packedargs.go).
		s.single = true
	}
	if !s.cluster && strings.Contains(info, "redis_mode:cluster") {
		// A cluster node reached through a plain client (one address, as
		// a single seed makes): a call's keys must still be in one slot.
		s.cluster = true
	}
	return nil
}

// HistoryEntry is one transition of a job.
type HistoryEntry struct {
	At     time.Time
	From   jobstate.State
	To     jobstate.State
	Reason jobstate.Reason
	Node   string
}

// JobRecord is a job as Redis holds it.
type JobRecord struct {
	ID           string
	State        jobstate.State
	Topic        string
	Tenant       string
	TraceID      string
	Node         string
	Worker       string
	Subject      string
	Reason       jobstate.Reason
	ResultPtr    string
	ErrorCode    string
	ErrorMessage string
	Fence        int64
	Attempts     int
	Created      time.Time
	Updated      time.Time
	Request      []byte
	// LockHolder is the lock's value ("<node>|<fence>"), empty when unlocked.
	LockHolder string
	History    []HistoryEntry
	// Fields is the raw record (decisions, approval, deadlines, ...).
	Fields map[string]string
}

// GetJob reads a job's record (with its history) and lock in one round trip.
func (s *Store) GetJob(ctx context.Context, jobID string) (*JobRecord, error) {
	pipe := s.rdb.Pipeline()
	h := pipe.HGetAll(ctx, s.keys.Job(jobID))
	lock := pipe.Get(ctx, s.keys.Lock(jobID))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("store: read job %s: %w", jobID, err)
	}
	f := h.Val()
	if len(f) == 0 {
		return nil, ErrNotFound
	}
	ExpandRecord(f)
	r := &JobRecord{
		ID: jobID, State: jobstate.State(f["s"]), Topic: f["topic"], Tenant: f["tenant"],
		TraceID: f["trace"], Node: f["node"], Worker: f["worker"], Subject: f["subj"],
		Reason: jobstate.Reason(f["reason"]), ResultPtr: f["result_ptr"], ErrorCode: f["error_code"],
		ErrorMessage: f["error_message"], Request: []byte(f["req"]), LockHolder: lock.Val(), Fields: f,
	}
	r.Fence, _ = strconv.ParseInt(f["fence"], 10, 64)
	r.Attempts, _ = strconv.Atoi(f["attempts"])
	r.Created = parseMillis(f["created"])
	r.Updated = updatedAt(f["updated"], r.Created)
	r.History = History(f)
	return r, nil
}

// updatedAt is a record's last change: its "updated" field, or, for a
// record never changed since its create (which writes no "updated"), when
// it was created.
func updatedAt(updated string, created time.Time) time.Time {
	if t := parseMillis(updated); !t.IsZero() {
		return t
	}
	return created
}

func parseMillis(s string) time.Time {
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// CountIndex returns how many jobs are in state across all shards.
func (s *Store) CountIndex(ctx context.Context, state jobstate.State) (int64, error) {
	counts, err := s.CountStates(ctx, state)
	return counts[state], err
}
