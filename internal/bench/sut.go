package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/inspect"
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
	// PoolDispatch: the floor publishes every request on the topic's pool
	// subject (stock CAP workers, WorkerCAP) rather than to each worker.
	PoolDispatch bool   `json:"pool_dispatch,omitempty"`
	LogLevel     string `json:"log_level,omitempty"`
	// ParkAfter and LockTTL go to the node's Config (0: its defaults);
	// DispatchTimeout, when set, replaces the node's dispatch timeout (a
	// hold run keeps jobs DISPATCHED for longer than the default 300 s).
	ParkAfter       time.Duration `json:"park_after,omitempty"`
	CapacityGrace   time.Duration `json:"capacity_grace,omitempty"`
	MaxAdmitting    int           `json:"max_admitting,omitempty"`
	LockTTL         time.Duration `json:"lock_ttl,omitempty"`
	DispatchTimeout time.Duration `json:"dispatch_timeout,omitempty"`
	// MemoryLimit is the node process's Go soft memory limit (0: none).
	MemoryLimit int64 `json:"memory_limit,omitempty"`
	// KeyLimit, when > 0, limits every concurrency key to that many jobs at
	// once (the pools file's concurrency_keys "*").
	KeyLimit int `json:"key_limit,omitempty"`
	// RateLimit, when > 0, declares the bucket RateBucket of that many
	// tokens a second (the pools file's rate_limits).
	RateLimit int `json:"rate_limit,omitempty"`
}

// sut is a running system under test with the counters the bench reads: a
// go-redis hook on its Redis client and the statistics of its own NATS
// connection. Both are passed to troupe.NewNode (Config.Redis, Config.NATS),
// so the node runs exactly as embedded, with counting clients.
type sut struct {
	spec sutSpec
	rdb  redis.UniversalClient
	rc   *redisCounter
	nc   *nats.Conn
	node *troupe.Node
	fl   *floor
}

// benchPools routes the bench topic to the bench pool and, with keyLimit >
// 0, limits every concurrency key to keyLimit jobs at once; with rate > 0
// it declares the bucket RateBucket of rate tokens a second (burst rate).
func benchPools(topic, pool string, keyLimit, rate int) (*troupe.Pools, error) {
	y := fmt.Sprintf("topics:\n  %s: %s\npools:\n  %s: {requires: []}\n", topic, pool, pool)
	if keyLimit > 0 {
		y += fmt.Sprintf("concurrency_keys:\n  \"*\": {limit: %d}\n", keyLimit)
	}
	if rate > 0 {
		y += fmt.Sprintf("rate_limits:\n  %s: {limit: %d, per: 1s}\n", RateBucket, rate)
	}
	return troupe.ParsePools([]byte(y))
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
		pools, err := benchPools(spec.Topic, spec.Pool, spec.KeyLimit, spec.RateLimit)
		if err != nil {
			s.close()
			return nil, err
		}
		var timeouts *troupe.Timeouts
		if spec.DispatchTimeout > 0 {
			timeouts = troupe.DefaultTuning().Timeouts
			timeouts.Dispatch = spec.DispatchTimeout
			timeouts.Running = max(timeouts.Running, spec.DispatchTimeout)
		}
		node, err := troupe.NewNode(troupe.Config{
			NodeID: spec.NodeID, NATS: nc, Redis: rdb,
			KeyPrefix: spec.KeyPrefix, SubjectPrefix: spec.SubjectPrefix, StreamPrefix: spec.StreamPrefix,
			Pools: pools, Logger: log,
			Tuning: troupe.Tuning{ParkAfter: spec.ParkAfter, LockTTL: spec.LockTTL, CapacityGrace: spec.CapacityGrace,
				MaxAdmitting: spec.MaxAdmitting, Timeouts: timeouts},
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
	ws, err := inspect.Of(s.node).Workers()
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
	// Node is the node's job and forwarding counters; nil when the sut is
	// no node (the floor).
	Node *NodeCounters `json:"node_counters,omitempty"`
	// NodeID names the node (the floor's slot too).
	NodeID string `json:"node_id,omitempty"`
	// PID is the process the node runs in; set by the bench, not sent by a
	// child (its ready reply carries it).
	PID int `json:"-"`
	// Parts are the readings of each node when the bench runs several
	// (Config.Nodes > 1); this Snap is then their sum. Never sent by a
	// child.
	Parts []Snap `json:"-"`
}

// NodeCounters are counters the bench reads from a node's Prometheus
// registry (jobactor.Metrics), each summed over its labels unless split here.
type NodeCounters struct {
	// Received: jobs this node created from a submit
	// (troupe_jobs_received_total).
	Received float64 `json:"received"`
	// Dispatched: job requests it published to a worker
	// (troupe_jobs_dispatched_total).
	Dispatched float64 `json:"dispatched"`
	// Completed: jobs it wrote terminal, any state
	// (troupe_jobs_completed_total).
	Completed float64 `json:"completed"`
	// ForwardTaken and ForwardReturned: results and cancels it passed to
	// the node owning their job, which took them or did not (then the
	// message went back to JetStream): troupe_events_forwarded_total by
	// outcome.
	// UnwrittenWaits: jobs that began to wait for room within their
	// capacity grace, with no record (troupe_capacity_waits_unwritten_total).
	UnwrittenWaits  float64 `json:"unwritten_waits,omitempty"`
	ForwardTaken    float64 `json:"forward_taken"`
	ForwardReturned float64 `json:"forward_returned"`
	// Busy: its job activations that found the job's lock held by another
	// node (troupe_job_activations_busy_total).
	Busy float64 `json:"busy"`
	// SubmitsRedelivered: submits it took on a second or later delivery
	// (troupe_submits_redelivered_total); SubmitTouches: the in-progress
	// signals it sent for fetched submits not yet acked
	// (troupe_submit_progress_touches_total).
	SubmitsRedelivered float64 `json:"submits_redelivered,omitempty"`
	SubmitTouches      float64 `json:"submit_touches,omitempty"`
	// LocksLost: job locks its renewer reported lost to their job
	// (troupe_lock_renewals_total, outcome lost): a node under load that
	// let its own locks lapse (#33 item 5 wants none).
	LocksLost float64 `json:"locks_lost"`
}

// counters reads everything but CPU and RSS, which depend on where the sut
// runs.
func (s *sut) counters() Snap {
	st := s.nc.Stats()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	sn := Snap{Redis: s.rc.snapshot(), NATSIn: st.InMsgs, NATSOut: st.OutMsgs,
		GCs: ms.NumGC, AllocBytes: ms.TotalAlloc, Mallocs: ms.Mallocs, HeapAlloc: ms.HeapAlloc,
		NodeID: s.spec.NodeID}
	sn.CapacityWaits, sn.Node = s.nodeCounters()
	return sn
}

// Node metrics the bench reads (jobactor.Metrics).
const (
	// capacityWaitsMetric counts jobs written SCHEDULED to wait for room in
	// their pool.
	capacityWaitsMetric = "troupe_capacity_waits_total"
	receivedMetric      = "troupe_jobs_received_total"
	dispatchedMetric    = "troupe_jobs_dispatched_total"
	completedMetric     = "troupe_jobs_completed_total"
	forwardedMetric     = "troupe_events_forwarded_total" // label outcome: taken, returned
	busyMetric          = "troupe_job_activations_busy_total"
	redeliveredMetric   = "troupe_submits_redelivered_total"
	submitTouchesMetric = "troupe_submit_progress_touches_total"
	// unwrittenWaitsMetric counts jobs that waited for room within their
	// capacity grace, unwritten.
	unwrittenWaitsMetric = "troupe_capacity_waits_unwritten_total"
	renewalsMetric       = "troupe_lock_renewals_total" // label outcome: lost among others
)

// nodeCounters reads the node's capacity waits (summed over their reasons)
// and its job and forwarding counters from its registry; nil, nil with no
// node. A counter not yet gathered reads 0 (a counter vec with no label
// values yet is not gathered). A Gather error still returns what it could
// read, and one bad collector elsewhere must not hide these counters.
func (s *sut) nodeCounters() (*float64, *NodeCounters) {
	if s.node == nil || s.node.Metrics() == nil {
		return nil, nil
	}
	mfs, _ := s.node.Metrics().Gather()
	return countersOf(mfs)
}

// countersOf reads the capacity waits and the node counters from a node
// registry's gathered metric families.
func countersOf(mfs []*dto.MetricFamily) (*float64, *NodeCounters) {
	var waits float64
	nc := &NodeCounters{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetCounter().GetValue()
			switch mf.GetName() {
			case capacityWaitsMetric:
				waits += v
			case receivedMetric:
				nc.Received += v
			case dispatchedMetric:
				nc.Dispatched += v
			case completedMetric:
				nc.Completed += v
			case busyMetric:
				nc.Busy += v
			case redeliveredMetric:
				nc.SubmitsRedelivered += v
			case submitTouchesMetric:
				nc.SubmitTouches += v
			case unwrittenWaitsMetric:
				nc.UnwrittenWaits += v
			case renewalsMetric:
				if labelValue(m.GetLabel(), "outcome") == "lost" {
					nc.LocksLost += v
				}
			case forwardedMetric:
				switch labelValue(m.GetLabel(), "outcome") {
				case "taken":
					nc.ForwardTaken += v
				case "returned":
					nc.ForwardReturned += v
				}
			}
		}
	}
	return &waits, nc
}

// labelValue is the value of label name among a metric's labels ("" when
// absent).
func labelValue(labels []*dto.LabelPair, name string) string {
	for _, l := range labels {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// inflight reads what a hold run samples: a GC first (so HeapAlloc is the
// live heap), then the heap, the resident set, live actors and parked jobs.
func (s *sut) inflight(ctx context.Context) Snap {
	runtime.GC()
	sn := s.counters()
	sn.RSS, _ = procRSS(os.Getpid())
	if s.node != nil {
		sn.LiveActors, _ = inspect.Of(s.node).LiveJobActors()
		sn.Parked, _ = inspect.Of(s.node).Store().ParkedCount(ctx, s.node.ID())
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
