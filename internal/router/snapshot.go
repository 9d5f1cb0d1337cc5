package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/registry"
)

// Snapshot writer defaults.
const (
	// SnapshotEveryDefault: a restarted node's view is at most this old.
	SnapshotEveryDefault = 5 * time.Second
	// SnapshotLockTTLDefault is three write periods, so one slow tick does
	// not hand the writer role to another replica, while a dead writer is
	// replaced within 15 s.
	SnapshotLockTTLDefault = 15 * time.Second
	// SnapshotTTLDefault: after a minute with no replica writing, the
	// workers in a snapshot may well be gone, and hydrating them would send
	// jobs to the dead; a cold start is the better guess.
	SnapshotTTLDefault = time.Minute
	// WarmStartTimeoutDefault bounds the read at start: a slow Redis costs
	// a cold start, never a node that does not come up.
	WarmStartTimeoutDefault = 5 * time.Second
)

// snapshotAskTimeout bounds the wait for the router's copy; the router
// answers from memory, so only a wedged router takes this long.
const snapshotAskTimeout = 2 * time.Second

// SnapshotWriterConfig configures a SnapshotWriter.
type SnapshotWriterConfig struct {
	// Redis and Prefix locate the snapshot (the node's client and key
	// prefix).
	Redis  redis.UniversalClient
	Prefix string
	// NodeID is this replica's name in the writer lock.
	NodeID string
	// Root and Router reach the router actor.
	Root   *actor.RootContext
	Router *actor.PID
	// Every, LockTTL, SnapshotTTL and WarmStartTimeout default to the
	// Snapshot*Default constants.
	Every            time.Duration
	LockTTL          time.Duration
	SnapshotTTL      time.Duration
	WarmStartTimeout time.Duration
	// Log receives the writer's lines (default slog.Default()).
	Log *slog.Logger
}

// SnapshotWriter saves the router's registry to Redis so a restarted node
// knows its workers before their next heartbeats. Across replicas exactly
// one writes, the holder of a TTL lock it renews at every tick; the write
// itself checks the lock inside Redis, so a writer that stalled past its
// lock cannot overwrite its successor's snapshot. It talks to the router
// only by messages (a SnapshotRequest for a copy, a Hydrate at start), so
// the router never waits on Redis.
type SnapshotWriter struct {
	// Immutable after construction.
	cfg   SnapshotWriterConfig
	store *registry.SnapshotStore
	log   *slog.Logger

	// Confined to the writer goroutine (or to the caller of WriteOnce before
	// Start).
	holding bool
	lastErr string

	startOnce sync.Once
	stopOnce  sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// NewSnapshotWriter checks cfg and returns a writer that is not running.
func NewSnapshotWriter(cfg SnapshotWriterConfig) (*SnapshotWriter, error) {
	switch {
	case cfg.Redis == nil:
		return nil, errors.New("router: snapshot writer needs Redis")
	case cfg.NodeID == "":
		return nil, errors.New("router: snapshot writer needs NodeID")
	case cfg.Root == nil || cfg.Router == nil:
		return nil, errors.New("router: snapshot writer needs Root and Router")
	}
	if cfg.Every <= 0 {
		cfg.Every = SnapshotEveryDefault
	}
	if cfg.LockTTL <= 0 {
		cfg.LockTTL = SnapshotLockTTLDefault
	}
	if cfg.SnapshotTTL <= 0 {
		cfg.SnapshotTTL = SnapshotTTLDefault
	}
	if cfg.WarmStartTimeout <= 0 {
		cfg.WarmStartTimeout = WarmStartTimeoutDefault
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &SnapshotWriter{cfg: cfg, store: registry.NewSnapshotStore(cfg.Redis, cfg.Prefix),
		log: cfg.Log.With("component", "snapshot"), stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// WarmStart reads the stored snapshot (bounded by WarmStartTimeout) and
// hydrates the router with it, returning how many workers it added. A
// missing, unreadable or corrupt snapshot is logged and means a cold start
// (0), never an error: the node works without it.
func (s *SnapshotWriter) WarmStart(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.WarmStartTimeout)
	defer cancel()
	snap, err := s.store.Load(ctx)
	switch {
	case errors.Is(err, registry.ErrNoSnapshot):
		s.log.Info("no registry snapshot; cold start")
		return 0
	case err != nil:
		s.log.Warn("registry snapshot unusable; cold start", "err", err)
		return 0
	}
	wait := s.cfg.WarmStartTimeout
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl)
	}
	if wait <= 0 {
		s.log.Warn("registry snapshot read used the whole warm-start budget; cold start")
		return 0
	}
	res, err := s.cfg.Root.RequestFuture(s.cfg.Router, &Hydrate{Workers: snap.Workers}, wait).Result()
	if err != nil {
		s.log.Warn("router did not take the snapshot; cold start", "err", err)
		return 0
	}
	added := res.(*Hydrated).Added
	s.log.Info("warm start from registry snapshot", "workers", added, "written_by", snap.Node,
		"age", time.Since(snap.WrittenAt).Round(time.Millisecond))
	return added
}

// Start writes a snapshot every Every while this replica holds the lock.
func (s *SnapshotWriter) Start() {
	s.startOnce.Do(func() { go s.loop() })
}

func (s *SnapshotWriter) loop() {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Every)
			_, err := s.WriteOnce(ctx)
			cancel()
			if err != nil && err.Error() != s.lastErr {
				s.log.Warn("registry snapshot not written", "err", err)
			}
			s.lastErr = ""
			if err != nil {
				s.lastErr = err.Error()
			}
		}
	}
}

// WriteOnce takes or renews the writer lock and, if this replica holds it,
// writes the router's current registry. It reports whether it wrote. Start
// calls it every tick; call it directly only while the loop is not running.
func (s *SnapshotWriter) WriteOnce(ctx context.Context) (bool, error) {
	held, err := s.store.Acquire(ctx, s.cfg.NodeID, s.cfg.LockTTL)
	if err != nil {
		return false, err
	}
	if held != s.holding {
		s.holding = held
		if held {
			s.log.Info("this replica writes the registry snapshot")
		}
	}
	if !held {
		return false, nil
	}
	res, err := s.cfg.Root.RequestFuture(s.cfg.Router, &SnapshotRequest{}, snapshotAskTimeout).Result()
	if err != nil {
		return false, fmt.Errorf("router: ask for registry copy: %w", err)
	}
	reply := res.(*SnapshotReply)
	data, err := registry.EncodeSnapshot(s.cfg.NodeID, reply.At, reply.Workers)
	if err != nil {
		return false, err
	}
	return s.store.Write(ctx, s.cfg.NodeID, data, s.cfg.SnapshotTTL)
}

// Stop ends the loop and gives up the lock, so another replica takes over
// at its next tick rather than after the lock TTL. Call it before stopping
// the router.
func (s *SnapshotWriter) Stop() {
	s.stopOnce.Do(func() {
		close(s.stop)
		started := true
		s.startOnce.Do(func() { started = false })
		if started {
			<-s.done
		}
		ctx, cancel := context.WithTimeout(context.Background(), snapshotAskTimeout)
		defer cancel()
		if err := s.store.Release(ctx, s.cfg.NodeID); err != nil {
			s.log.Warn("snapshot lock not released; it expires on its own", "err", err)
		}
	})
}
