// Package troupe embeds a Troupe node: a CAP v2 job scheduler built as one
// supervised actor per in-flight job, with its state in Redis and its traffic
// on NATS JetStream.
//
//	node, err := troupe.NewNode(troupe.Config{NATSURL: "nats://127.0.0.1:4222", RedisURL: "redis://127.0.0.1:6379"})
//	if err != nil { ... }
//	if err := node.Start(ctx); err != nil { ... }
//	defer node.Stop(context.Background())
package troupe

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/internal/defaults"
	"github.com/troupe-run/troupe/internal/intake"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/keyslot"
	"github.com/troupe-run/troupe/internal/outputgate"
	"github.com/troupe-run/troupe/internal/ratelimit"
	"github.com/troupe-run/troupe/internal/recovery"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/schedule"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/internal/tracing"
	"github.com/troupe-run/troupe/safety"
)

// Node is one Troupe replica. Its long-lived parts are components
// (component.go), started in the order Node.parts declares and stopped in
// reverse.
type Node struct {
	cfg   Config
	log   *slog.Logger
	comps components
	bg    sync.WaitGroup // result-stream reset handling (resultsLost)
	// waiters are the callers of Wait.
	waiters *waiters
	// dataLostAt: when the renewer last saw Redis lose its data (unix ms).
	dataLostAt atomic.Int64
	// alone indexes the jobs this node left waiting alone; aloneLost
	// carries, when Redis lost its data, when it was last seen intact
	// (alone_node.go).
	alone          *jobactor.AloneWaits
	aloneLost      chan time.Time
	lostWaitsWoken prometheus.Counter
	lostWaitSweeps prometheus.Counter
	// keeper recreates lost streams and probes them (nil with StreamCheck
	// negative); Ready reports a stream it found refusing writes.
	keeper atomic.Pointer[bus.StreamKeeper]

	nc      *nats.Conn
	ownNC   bool
	js      jetstream.JetStream
	rdb     redis.UniversalClient
	ownRDB  bool
	store   *store.Store
	writer  *store.Writer
	renewer *store.LockRenewer
	subj    bus.Subjects

	sys    *actor.ActorSystem
	router *actor.PID
	beats  *router.Beats // what the router hears of each worker
	shards []*actor.PID
	env    *jobactor.Env
	rates  *ratelimit.Limiter // rate limit buckets (ratesPart)
	// reload is what a pools reload changes for the job core (pools.go).
	reload    poolsReload
	intake    *intake.Intake
	intakeRef atomic.Pointer[intake.Intake] // n.intake, for the router's goroutine
	// peers: how many other replicas the router last reported (peersKnown:
	// it has reported), handed to the intake once it exists (peersTo).
	peersMu    sync.Mutex
	peers      int
	peersKnown bool
	sigs       *intake.Signatures
	inbox      []*nats.Subscription // the forwarding inbox (intake part)
	guard      *intake.Guard
	wheel      *jobactor.Wheel
	toucher    *jobactor.Toucher
	// submitTouches counts the submit fetch loops' in-progress signals
	// (bus.KeepInProgress), over every start of the intake.
	submitTouches atomic.Uint64
	safetyWaiters *jobactor.SafetyWaiters
	// keySlots and keyWaiters: the concurrency keys' slots in Redis and
	// this node's jobs waiting for one (nil without concurrency_keys).
	keySlots   *keyslot.Slots
	keyWaiters *jobactor.KeyWaiters
	jobSpans   *tracing.Tracer
	due        *recovery.DuePoller
	// duePoked is due while it runs (nil before and after): Decide pokes
	// it from any goroutine.
	duePoked atomic.Pointer[recovery.DuePoller]
	ticker   *schedule.Ticker // delayed and scheduled jobs (schedule_node.go)

	dispatcher *supervisor.PoolDispatcher
	resolver   *supervisor.Resolver
	sagas      *saga.Sagas
	scans      *jobactor.ScanPool

	poolsFromFile bool
	// keysOn: the node started with concurrency keys (the pools' or the
	// policy's): their slots and wakes run.
	keysOn       bool
	unbindPolicy func() // the policy engine's Bind (ratesPart)
	pools        *router.PoolsWatcher
	snap         *router.SnapshotWriter

	// stopTracer flushes and shuts down the OTLP exporter the node owns.
	stopTracer func(context.Context) error

	stopping atomic.Bool // Stop has begun: scrapes no longer ask the actors
	// beforeActorsStop, when set (tests), runs in Stop once the inbox
	// refuses forwarded events and before the job actors stop.
	beforeActorsStop func()
}

// NewNode validates cfg and returns a node that is not yet connected.
func NewNode(cfg Config) (*Node, error) {
	if cfg.NodeID == "" {
		host, _ := os.Hostname()
		cfg.NodeID = host + "-" + strconv.Itoa(os.Getpid())
		cfg.NodeID = strings.NewReplacer(".", "-", " ", "-", "*", "-", ">", "-").Replace(cfg.NodeID)
	}
	// The node id is a token of the node's inbox subject and part of lock
	// values ("<node>|<fence>").
	if err := intake.ValidateWorkerID(cfg.NodeID); err != nil || strings.Contains(cfg.NodeID, "|") {
		return nil, fmt.Errorf("troupe: node id %q: letters, digits, _ - : only", cfg.NodeID)
	}
	if cfg.NATSURL == "" {
		cfg.NATSURL = envOr("TROUPE_NATS_URL", nats.DefaultURL)
	}
	if cfg.RedisURL == "" {
		cfg.RedisURL = envOr("TROUPE_REDIS_URL", "redis://127.0.0.1:6379")
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = KeyPrefixDefault
	}
	if cfg.StreamPrefix == "" {
		cfg.StreamPrefix = StreamPrefixDefault
	}
	if cfg.Policy == nil {
		cfg.Policy = safety.AllowAll{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	poolsFromFile := false
	switch {
	case cfg.Pools != nil:
		cfg.routing = cfg.Pools.routing()
		cfg.rates = cfg.Pools.rates
	case cfg.PoolsFile != "":
		p, err := router.LoadPools(cfg.PoolsFile)
		if err != nil {
			return nil, fmt.Errorf("troupe: %w", err)
		}
		cfg.routing, poolsFromFile = p, true
		if cfg.rates, err = ratelimit.Load(cfg.PoolsFile); err != nil {
			return nil, fmt.Errorf("troupe: %w", err)
		}
	default:
		// The CLI's routing, so an embedder's first node runs the demo topics.
		cfg.routing = DefaultPools().routing()
	}
	t := &cfg.Tuning
	if t.Timeouts == nil && t.TimeoutsFile != "" {
		timeouts, err := jobactor.LoadTimeouts(t.TimeoutsFile)
		if err != nil {
			return nil, fmt.Errorf("troupe: %w", err)
		}
		t.Timeouts = (*Timeouts)(timeouts)
	} else if t.Timeouts != nil {
		c := *t.Timeouts // the node's own copy: the caller may reuse theirs
		t.Timeouts = &c
	}
	if t.DueIdlePoll == 0 && t.DuePoll > 0 {
		// Derived from the node's own poll interval, not the default's.
		t.DueIdlePoll = recovery.DueIdleFactor * t.DuePoll
	}
	defaults.Fill(t, DefaultTuning())
	if t.JobShards < 0 {
		t.JobShards = DefaultTuning().JobShards
	}
	if t.WorkerTTL < 0 {
		return nil, fmt.Errorf("troupe: worker TTL %v: want a positive duration (0: the default %v)", t.WorkerTTL, DefaultTuning().WorkerTTL)
	}
	if t.StreamMaxBytes < streamMaxBytesMin {
		return nil, fmt.Errorf("troupe: stream max bytes %d: want at least %d (1 MiB; 0: the default %d)", t.StreamMaxBytes, streamMaxBytesMin, int64(bus.StreamMaxBytes))
	}
	if t.StreamReplicas < 1 || t.StreamReplicas > bus.MaxStreamReplicas {
		return nil, fmt.Errorf("troupe: stream replicas %d: want 1..%d", t.StreamReplicas, bus.MaxStreamReplicas)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	if v := os.Getenv("TROUPE_JOB_TRACE"); v == "on" || v == "1" || v == "true" {
		cfg.Tuning.JobTrace = true
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeID), poolsFromFile: poolsFromFile,
		subj: bus.NewSubjects(cfg.SubjectPrefix), waiters: newWaiters()}
	n.checkWorkerTTL()
	// The policy file's limits, merged with the pools' (policy_limits.go).
	n.reload.spec, n.reload.poolsKeys = cfg.rates, cfg.routing.Keys
	if e := n.policyEngine(); e != nil {
		rates, keys, err := policyLimits(e.Policy())
		if err == nil {
			err = checkLimits(cfg.rates, rates, cfg.routing.Keys, keys)
		}
		if err != nil {
			return nil, fmt.Errorf("troupe: %w", err)
		}
		n.reload.policyRates, n.reload.policyKeys = rates, keys
	}
	n.keysOn = len(cfg.routing.Keys) > 0 || len(n.reload.policyKeys) > 0
	return n, nil
}

// Output content scans (phase 2) run on a small pool: each may take up to
// outputgate.ContentBudgetDefault, and a full queue skips (and counts) a
// scan rather than hold a result back.
const (
	scanWorkers = 16
	scanQueue   = 10_000
)

// streamMaxBytesMin is the smallest Tuning.StreamMaxBytes: a few full
// submits of the largest size JetStream takes by default.
const streamMaxBytesMin = 1 << 20

func (n *Node) outputGate() *outputgate.Gate {
	if n.cfg.Output == nil {
		return nil
	}
	m, err := outputgate.NewMetrics(n.cfg.Metrics)
	if err != nil {
		n.log.Warn("output metrics disabled", "err", err)
		m = nil
	}
	return &outputgate.Gate{Checker: n.cfg.Output, Results: &safety.RedisResultStore{Client: n.rdb}, Metrics: m}
}

// ReloadPools re-reads the pools file (and the runtime mappings) now; an
// invalid file keeps the config in use, and the error names the line.
func (n *Node) ReloadPools() error { return n.pools.Reload() }

func tenantLimit(limits map[string]int) func(string) int {
	if len(limits) == 0 {
		return nil
	}
	return func(tenant string) int { return limits[tenant] }
}

func redispatch(off []string) func(topic string) bool {
	if len(off) == 0 {
		return nil
	}
	skip := map[string]bool{}
	for _, t := range off {
		skip[t] = true
	}
	return func(topic string) bool { return !skip[topic] }
}

// Metrics returns the registry holding the node's metrics.
func (n *Node) Metrics() *prometheus.Registry { return n.cfg.Metrics }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// ID returns the node id.
func (n *Node) ID() string { return n.cfg.NodeID }

// Start connects to NATS and Redis, creates the streams, builds the actor
// tree and starts consuming: it starts the node's components in order
// (Node.parts). If one fails, those already started are stopped in reverse
// order and the error names the one that failed. A node starts once: Start
// after a Start (failed or not) or a Stop is refused.
func (n *Node) Start(ctx context.Context) error {
	stopCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	}
	if err := n.comps.start(ctx, n.parts(), stopCtx); err != nil {
		return err
	}
	n.log.Info("node started", "nats", connect.RedactURLs(n.nc.ConnectedUrl()), "subjects", n.subj.Prefix()+"sys.*",
		"streams", n.cfg.StreamPrefix)
	return nil
}

// dataLostRecently reports whether Redis lost its data within the
// retention of terminal records: an event for a job with no record is then
// a job whose record was lost, not one that never existed.
func (n *Node) dataLostRecently() bool {
	at := n.dataLostAt.Load()
	return at > 0 && time.Since(time.UnixMilli(at)) < max(n.store.Retention(), time.Hour)
}

// touchFor is how long the node touches one unwritten wait's submit at
// most: its capacity grace, and half a minute for the write that ends it.
func touchFor(grace time.Duration) time.Duration {
	if grace <= 0 {
		grace = jobactor.CapacityGraceDefault
	}
	return grace + 30*time.Second
}

// Stop stops consuming, stops the actors (releasing the locks of jobs still
// in flight so another replica can adopt them at once), flushes pending
// writes and closes the connections the node opened: it stops the started
// components in the reverse of their start order. It waits for the actors
// at most until ctx ends (`troupe node` gives it 10 s on SIGTERM); whatever
// has not stopped by then keeps its locks until they expire. Stop is safe to
// call more than once, and without or after a failed Start; called while
// Start runs, it makes Start fail before its next component and returns
// once what had started is stopped.
func (n *Node) Stop(ctx context.Context) error {
	n.stopping.Store(true)
	return n.comps.stop(ctx)
}
