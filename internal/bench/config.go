// Package bench is Troupe's end-to-end benchmark harness: simulated CAP
// workers, a submitter at full speed or at a fixed rate, a node under test (in
// a child process, in this process, or one the user runs), and the figures
// it reports — throughput, dispatch and submit → terminal latency,
// node CPU and RSS, Redis commands and round trips, NATS messages per job —
// together with a check of every job's final state. It also runs the floor:
// the same NATS and Redis traffic with no scheduling logic. Redis is one
// server or a Redis Cluster (several addresses, or a local cluster it starts:
// localcluster.go), read per master; ceilings.go turns per-master and
// per-node costs into the throughputs at which each would saturate, and
// matrix.go tabulates the scale matrix (scripts/scale-matrix.sh).
//
// cmd/troupe-bench is its command line (`make bench`); TestBenchSmoke runs it
// for CI. It is not linked into the troupe binary.
package bench

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/troupe-run/troupe/worker"
)

// NodeMode says where the node under test runs.
type NodeMode string

const (
	// NodeChild runs the node in a child process of the bench (the default):
	// its CPU and peak RSS are its own, read by the child itself, and its
	// Redis round trips are counted by a hook on its client.
	NodeChild NodeMode = "child"
	// NodeInProcess runs the node inside the bench process: what the smoke
	// test uses. CPU and RSS then cover node and harness together.
	NodeInProcess NodeMode = "inproc"
	// NodeExternal uses a node the user started with the run's prefixes;
	// the bench only submits and observes.
	NodeExternal NodeMode = "external"
)

// Target is the system under test.
type Target string

const (
	// TargetTroupe is a Troupe node.
	TargetTroupe Target = "troupe"
	// TargetFloor is the same NATS and Redis traffic with no scheduling logic.
	TargetFloor Target = "floor"
)

// Defaults for Config fields left zero.
const (
	JobsDefault    = 100_000
	WorkersDefault = 10
	// TimeoutDefault bounds a run from the first submit; at the reference
	// scheduler's 376 jobs/s, 20k jobs would take 53 s, so a run past 120 s
	// is broken rather than slow.
	TimeoutDefault = 120 * time.Second
	// WarmupDefault jobs run (and are waited for) before measuring: they
	// load the Lua scripts, fill connection pools and show that the node,
	// the workers and the prefixes fit together.
	WarmupDefault = 200
	TopicDefault  = "job.bench"
	PoolDefault   = "bench"
	// HeartbeatDefault is the CAP SDKs' interval.
	HeartbeatDefault = worker.HeartbeatDefault
	// SettleDefault is how long the bench keeps listening after the last job
	// is terminal, so late duplicate deliveries are still counted.
	SettleDefault = 300 * time.Millisecond
	// SubmitWindowDefault is the number of submits awaiting their JetStream
	// ack at full speed.
	SubmitWindowDefault = 4096
	RedisURLDefault     = "redis://127.0.0.1:6379"
	NATSURLDefault      = "nats://127.0.0.1:4222"
)

// WorkerMode is how the simulated workers take jobs.
type WorkerMode string

const (
	// WorkerDirect (the default) is Troupe's own worker: it subscribes to
	// its direct subject worker.<id>.jobs as well as the pool subject and
	// says so in its heartbeat (troupe.dispatch=direct), so the node sends
	// each job to the worker it chose.
	WorkerDirect WorkerMode = "direct"
	// WorkerCAP is a stock CAP SDK worker: it listens on its pool subject
	// only (queue group = subject), announces no dispatch label and sends no
	// progress, so the node publishes each job on the pool subject and NATS
	// picks the worker; results go on the standard result subject.
	WorkerCAP WorkerMode = "cap"
)

// MaxParallelDefault is the max_parallel_jobs each simulated worker
// announces: what an SDK worker states by default (worker.Config.MaxParallel).
const MaxParallelDefault = 64

// Config configures a run.
type Config struct {
	// Target is what to measure (default TargetTroupe).
	Target Target
	// Jobs is the number of measured jobs (default JobsDefault).
	Jobs int
	// Workers is the number of simulated workers (default WorkersDefault).
	Workers int
	// WorkerMode is how the workers take jobs (default WorkerDirect).
	WorkerMode WorkerMode
	// Rate is the submit rate in jobs/s; 0 submits at full speed.
	Rate float64
	// Delay is how long a worker holds a job before answering (0: at once).
	Delay time.Duration
	// MaxParallel is the max_parallel_jobs each simulated worker announces
	// in its heartbeats, and the limit its overfills are counted against.
	// 0: MaxParallelDefault (no limit in a hold run, whose jobs must all be
	// in flight at once); <0: no stated limit (announce 0, count no
	// overfill).
	MaxParallel int
	// Timeout bounds the measured part of the run (default TimeoutDefault).
	Timeout time.Duration
	// Warmup jobs before measuring (default WarmupDefault; <0 for none).
	Warmup int
	// Heartbeat is the workers' heartbeat interval (default HeartbeatDefault).
	Heartbeat time.Duration
	// Settle is the listening time after completion (default SettleDefault).
	Settle time.Duration
	// SubmitWindow bounds un-acked submits (default SubmitWindowDefault).
	SubmitWindow int
	// SubmitBatch, when > 0, submits as a client with many jobs at once
	// does instead of through the rolling window: 1, one acked publish per
	// job at a time (Client.Submit); N, N async publishes then one wait for
	// all their acks (Client.SubmitBatch). Submitters goroutines (default
	// 1) each do so. Rate does not apply.
	SubmitBatch, Submitters int

	RedisURL string // default RedisURLDefault
	NATSURL  string // default NATSURLDefault

	// Node says where the node runs (default NodeChild).
	Node NodeMode
	// Nodes is how many Troupe nodes run the jobs (default 1): replicas
	// with distinct node ids on the run's prefixes, so they share its
	// streams' durable consumers, its Redis keys and its workers, as
	// replicas in production do. Each is a child process of its own
	// (NodeChild) or a node inside the bench (NodeInProcess). Target troupe
	// only (the floor is one process); not with Hold or Adopt.
	Nodes int
	// ChildCommand runs ServeChild in a new process (NodeChild): the troupe
	// binary sets it to itself with its hidden serve argument.
	ChildCommand []string
	// NodePID, with NodeExternal, is the node's process, for CPU and RSS.
	NodePID int

	// RunID names the run and derives its prefixes (default: random). With
	// NodeExternal it must match the prefixes the node was started with.
	RunID string
	Topic string // default TopicDefault
	Pool  string // default PoolDefault

	// CPUProfile, if set, is written with the node's CPU profile over the
	// measured part of the run (child: the node process alone, which also
	// writes its allocation profile since its start to CPUProfile+".allocs";
	// inproc: the bench process).
	CPUProfile string
	// Progress receives a one-line progress bar (nil: none).
	Progress io.Writer
	// Stderr receives a child node's logs (default: discarded).
	Stderr io.Writer
	// Log receives the bench's own lines and an in-process node's warnings.
	Log *slog.Logger
	// NodeLogLevel is the node's log floor (default warn).
	NodeLogLevel string
	// Keep leaves the run's streams and keys in place for inspection.
	Keep bool

	// Hold makes the workers hold every measured job without answering
	// until all of them are with a worker (DISPATCHED: in flight at once);
	// the bench then samples the node for HoldFor (RSS, heap, live actors,
	// parked jobs, Redis commands/s and memory), has the workers answer
	// everything, and checks every job SUCCEEDED exactly once (see hold.go).
	Hold bool
	// HoldFor is how long the in-flight state is sampled (default
	// HoldForDefault: three lock-renewal intervals at the default lock TTL).
	HoldFor time.Duration
	// Adopt (child mode; implies Hold): once the jobs are in flight, start a
	// second node, kill -9 the first, and time the second's adoption of
	// every job before the workers answer.
	Adopt bool
	// ParkAfter and LockTTL are passed to the node(s) under test (0: the
	// node's defaults).
	ParkAfter time.Duration
	LockTTL   time.Duration
	// CapacityGrace is passed to the node(s) too: how long a job waiting
	// for capacity stays unwritten (0: the node's default, 2 s).
	CapacityGrace time.Duration
	// MaxAdmitting is passed to the node(s) too: the jobs a node takes
	// from the submit stream and holds un-acked before it pulls more
	// (0: the node's default, jobactor.MaxAdmittingDefault; negative: no
	// bound).
	MaxAdmitting int
	// NodeMemoryLimit, when set, is the node's Go soft memory limit
	// (debug.SetMemoryLimit, what GOMEMLIMIT sets for `troupe node`).
	NodeMemoryLimit int64
	// ConcurrencyKeys, when > 0, gives measured job i the concurrency key
	// keyName(i mod ConcurrencyKeys) (meta.labels troupe.concurrency_key,
	// round-robin) and runs the node(s) with a pools file limiting every key
	// to KeyLimit (concurrency_keys: {"*": {limit: KeyLimit}}). The workers
	// count per key the jobs they hold at once (Result.Keys).
	ConcurrencyKeys, KeyLimit int
	// keysUnenforced (tests) runs the node(s) with no key limit while the
	// workers still count against KeyLimit: the over-fills must show.
	keysUnenforced bool
	// HeapProfile, with Hold, is written with the node's heap profile at the
	// end of the hold window (after a GC).
	HeapProfile string
}

// HoldForDefault samples the in-flight state over three lock renewals at the
// default 60 s lock TTL.
const HoldForDefault = 60 * time.Second

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("bench: config")

func (c *Config) withDefaults() error {
	if c.Target == "" {
		c.Target = TargetTroupe
	}
	if c.Target != TargetTroupe && c.Target != TargetFloor {
		return fmt.Errorf("%w: unknown target %q", ErrConfig, c.Target)
	}
	if c.Jobs == 0 {
		c.Jobs = JobsDefault
	}
	if c.Workers == 0 {
		c.Workers = WorkersDefault
	}
	switch c.WorkerMode {
	case "":
		c.WorkerMode = WorkerDirect
	case WorkerDirect, WorkerCAP:
	default:
		return fmt.Errorf("%w: unknown worker mode %q (direct or cap)", ErrConfig, c.WorkerMode)
	}
	if c.Jobs < 1 || c.Workers < 1 || c.Rate < 0 || c.Delay < 0 {
		return fmt.Errorf("%w: jobs and workers must be ≥ 1, rate and delay ≥ 0", ErrConfig)
	}
	if c.Timeout <= 0 {
		c.Timeout = TimeoutDefault
	}
	if c.Warmup == 0 {
		c.Warmup = WarmupDefault
	}
	c.Warmup = max(c.Warmup, 0)
	if c.Heartbeat <= 0 {
		c.Heartbeat = HeartbeatDefault
	}
	if c.Settle <= 0 {
		c.Settle = SettleDefault
	}
	if c.SubmitWindow <= 0 {
		c.SubmitWindow = SubmitWindowDefault
	}
	if c.SubmitBatch < 0 || c.Submitters < 0 {
		return fmt.Errorf("%w: --submit-batch and --submitters must not be negative", ErrConfig)
	}
	if c.SubmitBatch > 0 && c.Rate > 0 {
		return fmt.Errorf("%w: --submit-batch submits as fast as acks come; it takes no --rate", ErrConfig)
	}
	c.Submitters = max(c.Submitters, 1)
	if c.RedisURL == "" {
		c.RedisURL = RedisURLDefault
	}
	if c.NATSURL == "" {
		c.NATSURL = NATSURLDefault
	}
	if c.Node == "" {
		c.Node = NodeChild
	}
	switch c.Node {
	case NodeChild, NodeInProcess:
	case NodeExternal:
		if c.Target == TargetFloor {
			return fmt.Errorf("%w: the floor always runs under the bench (child or inproc)", ErrConfig)
		}
		if c.RunID == "" {
			return fmt.Errorf("%w: an external node needs --run-id, and the node started with its prefixes", ErrConfig)
		}
	default:
		return fmt.Errorf("%w: unknown node mode %q", ErrConfig, c.Node)
	}
	if err := c.nodesDefaults(); err != nil {
		return err
	}
	if c.RunID == "" {
		c.RunID = newRunID()
	}
	if err := validRunID(c.RunID); err != nil {
		return err
	}
	if c.Topic == "" {
		c.Topic = TopicDefault
	}
	if c.Pool == "" {
		c.Pool = PoolDefault
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Stderr == nil {
		c.Stderr = io.Discard
	}
	if c.NodeLogLevel == "" {
		c.NodeLogLevel = "warn"
	}
	if c.Adopt {
		c.Hold = true
		if c.Node != NodeChild || c.Target != TargetTroupe {
			return fmt.Errorf("%w: --adopt kills a node process: it needs --node child and the troupe target", ErrConfig)
		}
	}
	if err := c.maxParallelDefaults(); err != nil {
		return err
	}
	if c.Hold {
		if c.Delay > 0 {
			return fmt.Errorf("%w: --hold and --delay: pick one", ErrConfig)
		}
		if c.HoldFor <= 0 {
			c.HoldFor = HoldForDefault
		}
	}
	if c.ParkAfter < 0 && c.ParkAfter != -1 {
		c.ParkAfter = -1
	}
	return c.keysDefaults()
}

// keysDefaults checks the concurrency-key mode (ConcurrencyKeys, KeyLimit).
func (c *Config) keysDefaults() error {
	switch {
	case c.ConcurrencyKeys == 0 && c.KeyLimit == 0:
		return nil
	case c.ConcurrencyKeys < 1 || c.KeyLimit < 1:
		return fmt.Errorf("%w: --concurrency-keys and --key-limit go together, each ≥ 1", ErrConfig)
	case c.Target != TargetTroupe || c.Node == NodeExternal:
		return fmt.Errorf("%w: --concurrency-keys runs Troupe nodes the bench starts (child or inproc)", ErrConfig)
	case c.Hold:
		return fmt.Errorf("%w: --concurrency-keys and --hold: pick one (held jobs never free their key's slots)", ErrConfig)
	}
	return nil
}

// IdealMakespan is the shortest time the keys allow for the measured jobs:
// each key runs KeyLimit jobs of Delay at once, so jobs/(keys×limit) rounds
// of Delay (rounded up; 0 outside the concurrency-key mode).
func (c *Config) IdealMakespan() time.Duration {
	if c.ConcurrencyKeys < 1 || c.KeyLimit < 1 {
		return 0
	}
	slots := c.ConcurrencyKeys * c.KeyLimit
	return time.Duration((c.Jobs+slots-1)/slots) * c.Delay
}

// nodesDefaults fills Nodes and refuses the combinations several nodes do
// not support.
func (c *Config) nodesDefaults() error {
	if c.Nodes == 0 {
		c.Nodes = 1
	}
	switch {
	case c.Nodes < 1:
		return fmt.Errorf("%w: --nodes must be ≥ 1", ErrConfig)
	case c.Nodes == 1:
		return nil
	case c.Target != TargetTroupe:
		return fmt.Errorf("%w: --nodes %d: the floor runs in one process (only Troupe runs as several nodes)", ErrConfig, c.Nodes)
	case c.Node == NodeExternal:
		return fmt.Errorf("%w: --nodes %d: the bench starts the nodes (child or inproc), not --node external", ErrConfig, c.Nodes)
	case c.Hold || c.Adopt:
		return fmt.Errorf("%w: --nodes %d: --hold and --adopt run one node", ErrConfig, c.Nodes)
	}
	return nil
}

// maxParallelDefaults fills MaxParallel (after Hold is settled). A hold run
// needs every job with a worker at once, which a stated limit below
// Jobs/Workers forbids: unset, it announces none; set too low, it is an
// error rather than a run that waits for capacity until it times out.
func (c *Config) maxParallelDefaults() error {
	if c.MaxParallel == 0 {
		c.MaxParallel = MaxParallelDefault
		if c.Hold {
			c.MaxParallel = -1
		}
	}
	if c.MaxParallel > math.MaxInt32 {
		return fmt.Errorf("%w: --max-parallel %d does not fit a heartbeat's int32", ErrConfig, c.MaxParallel)
	}
	if c.Hold && c.MaxParallel > 0 && c.MaxParallel*c.Workers < c.Jobs {
		return fmt.Errorf("%w: --hold keeps all %d jobs with %d workers at once: it needs --max-parallel ≥ %d, or 0 (no limit)",
			ErrConfig, c.Jobs, c.Workers, (c.Jobs+c.Workers-1)/c.Workers)
	}
	return nil
}

// announcedMaxParallel is the max_parallel_jobs the workers announce (0: no
// stated limit).
func (c *Config) announcedMaxParallel() int32 { return int32(max(c.MaxParallel, 0)) }
