package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/actors"
	"github.com/troupe-run/troupe/router"
)

// sutSpec says what system under test to start and where: a Troupe node or
// the floor, on the run's own prefixes. It is what the parent sends a child
// process, so it is plain JSON.
type sutSpec struct {
	Role          Target   `json:"role"`
	RedisURL      string   `json:"redis_url"`
	NATSURL       string   `json:"nats_url"`
	KeyPrefix     string   `json:"key_prefix"`
	SubjectPrefix string   `json:"subject_prefix"`
	StreamPrefix  string   `json:"stream_prefix"`
	Topic         string   `json:"topic"`
	Pool          string   `json:"pool"`
	NodeID        string   `json:"node_id"`
	WorkerIDs     []string `json:"worker_ids,omitempty"` // the floor's dispatch targets
	LogLevel      string   `json:"log_level,omitempty"`
	// ParkAfter and LockTTL go to the node's Config (0: its defaults);
	// DispatchTimeout, when set, replaces the node's dispatch timeout (a
	// hold run keeps jobs DISPATCHED for longer than the default 300 s).
	ParkAfter       time.Duration `json:"park_after,omitempty"`
	LockTTL         time.Duration `json:"lock_ttl,omitempty"`
	DispatchTimeout time.Duration `json:"dispatch_timeout,omitempty"`
	// MemoryLimit is the node process's Go soft memory limit (0: none).
	MemoryLimit int64 `json:"memory_limit,omitempty"`
}

// sut is a running system under test with the counters the bench reads: a
// go-redis hook on its Redis client and the statistics of its own NATS
// connection. Both are passed to troupe.NewNode (Config.Redis, Config.NATS),
// so the node runs exactly as embedded, with counting clients.
type sut struct {
	spec sutSpec
	rdb  *redis.Client
	rc   *redisCounter
	nc   *nats.Conn
	node *troupe.Node
	fl   *floor
}

// benchPools routes the bench topic to the bench pool.
func benchPools(topic, pool string) (*router.PoolConfig, error) {
	return router.ParsePools([]byte(fmt.Sprintf("topics:\n  %s: %s\npools:\n  %s: {requires: []}\n", topic, pool, pool)))
}

func startSUT(ctx context.Context, spec sutSpec, log *slog.Logger) (*sut, error) {
	rdb, rc, err := newCountedClient(spec.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("bench: redis url: %w", err)
	}
	nc, err := nats.Connect(spec.NATSURL, nats.Name("troupe-bench-"+string(spec.Role)+" "+spec.NodeID))
	if err != nil {
		_ = rdb.Close()
		return nil, fmt.Errorf("bench: connect nats %s: %w", spec.NATSURL, err)
	}
	s := &sut{spec: spec, rdb: rdb, rc: rc, nc: nc}
	switch spec.Role {
	case TargetTroupe:
		pools, err := benchPools(spec.Topic, spec.Pool)
		if err != nil {
			s.close()
			return nil, err
		}
		var timeouts *actors.Timeouts
		if spec.DispatchTimeout > 0 {
			timeouts = actors.DefaultTimeouts()
			timeouts.Dispatch = spec.DispatchTimeout
			timeouts.Running = max(timeouts.Running, spec.DispatchTimeout)
		}
		node, err := troupe.NewNode(troupe.Config{
			NodeID: spec.NodeID, NATS: nc, Redis: rdb,
			KeyPrefix: spec.KeyPrefix, SubjectPrefix: spec.SubjectPrefix, StreamPrefix: spec.StreamPrefix,
			Pools: pools, Logger: log, ParkAfter: spec.ParkAfter, LockTTL: spec.LockTTL, Timeouts: timeouts,
		})
		if err != nil {
			s.close()
			return nil, err
		}
		if err := node.Start(ctx); err != nil {
			_ = node.Stop(context.Background())
			s.close()
			return nil, err
		}
		s.node = node
	case TargetFloor:
		fl, err := startFloor(ctx, nc, rdb, spec)
		if err != nil {
			s.close()
			return nil, err
		}
		s.fl = fl
	default:
		s.close()
		return nil, fmt.Errorf("bench: unknown role %q", spec.Role)
	}
	return s, nil
}

// workers is how many live workers the node's router knows (the floor has no
// registry: it dispatches to the ids it was given).
func (s *sut) workers() (int, error) {
	if s.node == nil {
		return len(s.spec.WorkerIDs), nil
	}
	ws, err := s.node.Workers()
	return len(ws), err
}

// Snap is a reading of the system under test's own counters. CPU and PeakRSS
// are of the process it runs in; Scope says whether that process is the node
// alone or the bench with the node inside.
type Snap struct {
	CPU        time.Duration `json:"cpu_ns"`
	PeakRSS    int64         `json:"peak_rss_bytes"`
	Redis      RedisCounts   `json:"redis"`
	NATSIn     uint64        `json:"nats_in_msgs"`
	NATSOut    uint64        `json:"nats_out_msgs"`
	GCs        uint32        `json:"gcs"`
	AllocBytes uint64        `json:"alloc_bytes"`
	Mallocs    uint64        `json:"mallocs"`
	// RSS is the resident set now (VmRSS); HeapAlloc the Go heap's live
	// bytes (right after a GC when the snap was asked with one).
	RSS       int64  `json:"rss_bytes,omitempty"`
	HeapAlloc uint64 `json:"heap_alloc_bytes,omitempty"`
	// LiveActors and Parked count the node's job actors and the jobs it has
	// parked (in flight with no actor).
	LiveActors int   `json:"live_actors,omitempty"`
	Parked     int64 `json:"parked,omitempty"`
	// CapacityWaits is the node's troupe_capacity_waits_total summed over
	// its reasons; nil when the sut is no node (the floor).
	CapacityWaits *float64 `json:"capacity_waits,omitempty"`
}

// counters reads everything but CPU and RSS, which depend on where the sut
// runs.
func (s *sut) counters() Snap {
	st := s.nc.Stats()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return Snap{Redis: s.rc.snapshot(), NATSIn: st.InMsgs, NATSOut: st.OutMsgs,
		GCs: ms.NumGC, AllocBytes: ms.TotalAlloc, Mallocs: ms.Mallocs, HeapAlloc: ms.HeapAlloc,
		CapacityWaits: s.capacityWaits()}
}

// capacityWaitsMetric is the node's counter of jobs written SCHEDULED to
// wait for room in their pool (actors.Metrics.CapacityWaits).
const capacityWaitsMetric = "troupe_capacity_waits_total"

// capacityWaits sums the node's capacity-wait counter over its reasons (nil
// with no node); 0 before any wait, since a counter vec with no label values
// yet is not gathered. A Gather error still returns what it could read, and
// one bad collector elsewhere must not hide this counter.
func (s *sut) capacityWaits() *float64 {
	if s.node == nil || s.node.Metrics() == nil {
		return nil
	}
	mfs, _ := s.node.Metrics().Gather()
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != capacityWaitsMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return &sum
}

// inflight reads what a hold run samples: a GC first (so HeapAlloc is the
// live heap), then the heap, the resident set, live actors and parked jobs.
func (s *sut) inflight(ctx context.Context) Snap {
	runtime.GC()
	sn := s.counters()
	sn.RSS, _ = procRSS(os.Getpid())
	if s.node != nil {
		sn.LiveActors, _ = s.node.LiveJobActors()
		sn.Parked, _ = s.node.Store().ParkedCount(ctx, s.node.ID())
	}
	return sn
}

func (s *sut) stop(ctx context.Context) {
	if s.node != nil {
		_ = s.node.Stop(ctx)
	}
	if s.fl != nil {
		s.fl.stop()
	}
	s.close()
}

func (s *sut) close() {
	if s.nc != nil {
		_ = s.nc.Drain()
	}
	if s.rdb != nil {
		_ = s.rdb.Close()
	}
}
