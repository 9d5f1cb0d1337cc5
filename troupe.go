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
	"encoding/json"
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
	"github.com/troupe-run/troupe/internal/intake"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/jobtrace"
	"github.com/troupe-run/troupe/internal/logx"
	"github.com/troupe-run/troupe/internal/metricsx"
	"github.com/troupe-run/troupe/internal/recovery"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/signing"
)

// Node is one Troupe replica.
type Node struct {
	cfg       Config
	log       *slog.Logger
	bg        sync.WaitGroup // background reads started by Start (recovery.RememberParked)
	stopProbe chan struct{}  // ends the safety waiters' prober (and the Wait poller)
	waiters   *waiters       // callers of Wait
	// dataLostAt: when the renewer last saw Redis lose its data (unix ms).
	dataLostAt atomic.Int64
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
	shards []*actor.PID
	env    *jobactor.Env
	intake *intake.Intake
	guard  *intake.Guard
	wheel  *jobactor.Wheel
	due    *recovery.DuePoller

	dispatcher *supervisor.PoolDispatcher
	resolver   *supervisor.Resolver
	sagas      *saga.Sagas
	scans      *jobactor.ScanPool

	cancel context.CancelFunc
	subs   []*nats.Subscription

	poolsFromFile bool
	pools         *router.PoolsWatcher
	snap          *router.SnapshotWriter

	unsign []func() // releases the node's bus.SignAs registrations
	// stopTracer flushes and shuts down the OTLP exporter the node owns.
	stopTracer func(context.Context) error

	stopOnce sync.Once
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
	if cfg.StreamReplicas == 0 {
		cfg.StreamReplicas = 1
	}
	if cfg.StreamReplicas < 1 || cfg.StreamReplicas > bus.MaxStreamReplicas {
		return nil, fmt.Errorf("troupe: stream replicas %d: want 1..%d", cfg.StreamReplicas, bus.MaxStreamReplicas)
	}
	if cfg.JobShards <= 0 {
		cfg.JobShards = JobShardsDefault
	}
	if cfg.Policy == nil {
		cfg.Policy = safety.AllowAll{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	poolsFromFile := false
	if cfg.Pools == nil {
		if cfg.PoolsFile == "" {
			// The CLI's routing, so an embedder's first node runs the demo topics.
			cfg.Pools = DefaultPools()
		} else {
			p, err := router.LoadPools(cfg.PoolsFile)
			if err != nil {
				return nil, fmt.Errorf("troupe: %w", err)
			}
			cfg.Pools, poolsFromFile = p, true
		}
	}
	if cfg.Timeouts == nil {
		cfg.Timeouts = jobactor.DefaultTimeouts()
		if cfg.TimeoutsFile != "" {
			t, err := jobactor.LoadTimeouts(cfg.TimeoutsFile)
			if err != nil {
				return nil, fmt.Errorf("troupe: %w", err)
			}
			cfg.Timeouts = t
		}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = prometheus.NewRegistry()
	}
	if v := os.Getenv("TROUPE_JOB_TRACE"); v == "on" || v == "1" || v == "true" {
		cfg.JobTrace.Enabled = true
	}
	return &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeID), poolsFromFile: poolsFromFile,
		stopProbe: make(chan struct{}), waiters: newWaiters()}, nil
}

// registerRenewMetrics exports the lock renewer's outcome counters.
func (n *Node) registerRenewMetrics() {
	for _, m := range []struct {
		outcome string
		read    func(store.RenewStats) uint64
	}{
		{"renewed", func(s store.RenewStats) uint64 { return s.Renewed }},
		{"refused", func(s store.RenewStats) uint64 { return s.Refused }},
		{"failed", func(s store.RenewStats) uint64 { return s.Failed }},
		{"lost", func(s store.RenewStats) uint64 { return s.Lost }},
	} {
		read, r := m.read, n.renewer
		_ = n.cfg.Metrics.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "troupe_lock_renewals_total", Help: "Job lock renewal outcomes (lost = reported to the job).",
			ConstLabels: prometheus.Labels{"outcome": m.outcome},
		}, func() float64 { return float64(read(r.Stats())) }))
	}
	_ = n.cfg.Metrics.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "troupe_job_locks_held", Help: "Job locks this node holds and renews.",
	}, func() float64 { return float64(n.renewer.Held()) }))
}

// Output content scans (phase 2) run on a small pool: each may take up to
// safety.OutputContentBudgetDefault, and a full queue skips (and counts) a
// scan rather than hold a result back.
const (
	ScanWorkers = 16
	ScanQueue   = 10_000
)

func (n *Node) outputGate() *safety.OutputGate {
	if n.cfg.Output == nil {
		return nil
	}
	m, err := safety.NewOutputMetrics(n.cfg.Metrics)
	if err != nil {
		n.log.Warn("output metrics disabled", "err", err)
		m = nil
	}
	return &safety.OutputGate{Checker: n.cfg.Output, Results: &safety.RedisResultStore{Client: n.rdb}, Metrics: m}
}

// ReloadPools re-reads the pools file (and the runtime mappings) now; an
// invalid file keeps the config in use, and the error names the line.
func (n *Node) ReloadPools() error { return n.pools.Reload() }

// Mappings returns the runtime topic → pools mappings shared by every
// replica through Redis.
func (n *Node) Mappings() *router.MappingStore { return router.NewMappingStore(n.rdb, n.cfg.KeyPrefix) }

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

// Subjects returns the CAP subjects the node uses.
func (n *Node) Subjects() bus.Subjects { return n.subj }

// Store returns the node's Redis store (valid after Start).
func (n *Node) Store() *store.Store { return n.store }

// Start connects to NATS and Redis, creates the streams, builds the actor
// tree and starts consuming.
func (n *Node) Start(ctx context.Context) error {
	if err := n.connect(ctx); err != nil {
		return err
	}
	n.subj = bus.NewSubjects(n.cfg.SubjectPrefix)
	if n.cfg.Signer != nil {
		// Everything the node publishes goes through bus.Encode* under one
		// of these sender ids (the saga runner's is set in saga/rollback.go).
		n.unsign = append(n.unsign, bus.SignAs(n.cfg.NodeID, n.cfg.Signer),
			bus.SignAs("troupe-saga/"+n.cfg.NodeID, n.cfg.Signer))
	}
	n.store = store.New(n.rdb, store.Config{Prefix: n.cfg.KeyPrefix, LockTTL: n.cfg.LockTTL, RescueAfter: n.cfg.RescueAfter,
		DLQMaxBytes: n.cfg.DLQMaxBytes, Retention: n.cfg.Retention, DLQRetention: n.cfg.DLQRetention})
	if err := n.store.LoadScripts(ctx); err != nil {
		return err
	}
	if err := bus.EnsureReplicatedStreams(ctx, n.js, n.cfg.StreamPrefix, n.subj, n.cfg.StreamReplicas); err != nil {
		return err
	}
	n.writer = n.store.NewWriter(0, 0, 0)
	n.renewer = n.store.NewLockRenewer(n.log)
	n.renewer.KeepNodeLease(n.cfg.NodeID)
	dataLoss := prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_redis_data_loss_total",
		Help: "Times this node saw Redis lose its data (the epoch key vanished)."})
	_ = n.cfg.Metrics.Register(dataLoss)
	n.renewer.OnDataLoss(func() {
		dataLoss.Inc()
		n.dataLostAt.Store(time.Now().UnixMilli())
	})
	n.renewer.Start()
	n.registerRenewMetrics()

	// protoactor logs every restart and dead letter at Info; the node keeps
	// it to warnings so its own lines stay readable under load.
	actorLog := n.log.With("lib", "protoactor")
	n.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(logx.LevelFloor(actorLog.Handler(), slog.LevelWarn))
	}))
	root := n.sys.Root
	path := ""
	if n.poolsFromFile {
		path = n.cfg.PoolsFile
	}
	watcher, err := router.NewPoolsWatcher(router.PoolsWatcherConfig{Path: path, Base: n.cfg.Pools,
		Mappings: router.NewMappingStore(n.rdb, n.cfg.KeyPrefix), Log: n.log})
	if err != nil {
		return fmt.Errorf("troupe: %w", err)
	}
	pools, err := watcher.Load(ctx)
	if err != nil {
		return fmt.Errorf("troupe: %w", err)
	}
	n.pools = watcher
	// The router learns of evictions on its own goroutine; the jobs still
	// waiting on an evicted worker are told through their shards (no spawn:
	// a job with no live actor here is not waiting on this node).
	var intakeRef atomic.Pointer[intake.Intake]
	// What the router hears of each worker, for direct dispatches to carry.
	beats := router.NewBeats()
	n.router = root.SpawnPrefix(router.Props(router.Config{
		Pools: pools, TTL: n.cfg.WorkerTTL, Direct: n.subj.Worker, PoolSubj: n.subj.Pool, Log: n.log,
		Metrics: n.cfg.Metrics, NodeID: n.cfg.NodeID, Bounds: n.cfg.WorkerBounds,
		// A pick its job has neither started on nor given back a minute
		// after the dispatch timeout was never dispatched (router/picks.go).
		PickTTL: n.cfg.Timeouts.Dispatch + time.Minute,
		Gossip:  func(data []byte) { _ = n.nc.PublishMsg(bus.NewSignedMsg(n.subj.Capacity(), n.cfg.NodeID, data)) },
		Link:    func() (bool, uint64) { return n.nc.IsConnected(), n.nc.Stats().Reconnects },
		Heard:   func() uint64 { return n.nc.Stats().InMsgs },
		Beats:   beats,
		OnEvictJobs: func(workerID string, jobIDs []string, evictedAt time.Time) {
			if in := intakeRef.Load(); in != nil {
				for _, id := range jobIDs {
					in.Tell(id, &jobactor.WorkerLost{WorkerID: workerID, At: evictedAt})
				}
			}
		},
	}), "router")
	n.pools.Start(root, n.router)
	n.snap, err = router.NewSnapshotWriter(router.SnapshotWriterConfig{Redis: n.rdb, Prefix: n.cfg.KeyPrefix,
		NodeID: n.cfg.NodeID, Root: root, Router: n.router, Log: n.log})
	if err != nil {
		return fmt.Errorf("troupe: %w", err)
	}
	n.snap.WarmStart(ctx)
	n.snap.Start()
	n.wheel = jobactor.NewWheel(root)
	if n.cfg.Output != nil {
		n.scans = jobactor.NewScanPool(ScanWorkers, ScanQueue)
	}
	waiters := jobactor.NewSafetyWaiters()
	n.bg.Add(2)
	go func() {
		defer n.bg.Done()
		waiters.Probe(root, n.stopProbe)
	}()
	go func() {
		defer n.bg.Done()
		n.waiters.poll(n.stopProbe, n.store)
	}()
	jobSpans, err := n.startTracing(ctx)
	if err != nil {
		return fmt.Errorf("troupe: %w", err)
	}
	n.env = (&jobactor.Env{
		NodeID: n.cfg.NodeID, Writer: n.writer, Renewer: n.renewer, Router: n.router, Policy: n.cfg.Policy,
		Subjects: n.subj, Publish: n.nc.Publish, Log: n.log, Root: root,
		Keys: n.store.Keys(), Wheel: n.wheel, Metrics: jobactor.NewMetrics(n.cfg.Metrics), Timeouts: n.cfg.Timeouts,
		Forward: intake.ForwarderFrom(n.nc, n.subj, n.cfg.NodeID), Redispatch: redispatch(n.cfg.NoRedispatchTopics),
		TenantLimit: tenantLimit(n.cfg.TenantLimits),
		Output:      n.outputGate(), Scans: n.scans,
		MaxSchedulingAttempts: n.cfg.MaxSchedulingAttempts, Backoff: n.cfg.Backoff,
		PermanentGrace: n.cfg.PermanentGrace, ParkAfter: n.cfg.ParkAfter, CapacityGrace: n.cfg.CapacityGrace,
		ResendAfter: n.cfg.ResendAfter, Connected: n.nc.IsConnected, SafetyWaiters: waiters,
		DispatchStamp: beats.Stamp,
		DataLost:      n.dataLostRecently, SagaRetention: n.cfg.SagaRetention, UnknownHold: n.cfg.UnknownHold,
		WorkerLostGrace: n.cfg.WorkerLostGrace, OnTerminal: n.waiters.ended, Tracing: jobSpans,
		OwnerWait: n.store.OwnerWait, LockTTL: n.store.LockTTL(),
		MaxAdmitting: int64(n.cfg.MaxAdmitting), AdmissionHold: n.cfg.AdmissionHold, Toucher: jobactor.NewToucher(touchFor(n.cfg.CapacityGrace)),
	}).WithDefaults()
	n.dispatcher = supervisor.NewPoolDispatcher()
	onPool := actor.WithDispatcher(n.dispatcher)
	tc := n.cfg.JobTrace
	tc.Redis, tc.Keys, tc.NodeID, tc.Retention = n.rdb, n.store.Keys(), n.cfg.NodeID, n.store.Retention()
	tc.Log, tc.Metrics, tc.Origin = n.log, n.cfg.Metrics, jobactor.TraceOrigin
	tracer, err := jobtrace.New(n.sys, tc) // nil when off: no middleware at all
	if err != nil {
		return fmt.Errorf("troupe: %w", err)
	}
	env := n.env
	_ = n.cfg.Metrics.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "troupe_jobs_admitting",
		Help: "Jobs taken from the submit stream and not yet dispatched, written as waiting, or finished; at jobactor.MaxAdmittingDefault the node pulls no more submits.",
	}, func() float64 { return float64(env.Admitting.Load()) }))
	_ = n.cfg.Metrics.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "troupe_capacity_waits_unwritten",
		Help: "Jobs waiting for room within their capacity grace: no record yet, the submit held un-acked in JetStream.",
	}, func() float64 { return float64(env.Unwritten.Load()) }))
	_ = n.cfg.Metrics.Register(newWaitingCollector(n))
	_ = n.cfg.Metrics.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "troupe_capacity_submit_touches_total",
		Help: "In-progress signals sent to JetStream for the submits of jobs waiting within their capacity grace.",
	}, func() float64 { return float64(env.Toucher.Touches()) }))
	jobOpts := append([]actor.PropsOption{onPool}, tracer.PropsOptions()...)
	n.resolver = supervisor.NewResolver(supervisor.ResolverConfig{NodeID: n.cfg.NodeID, Holders: n.store.LockHolders,
		ForwardBatch: intake.BatchForwarderFrom(n.nc, n.subj, n.cfg.NodeID), Forwarded: n.env.Metrics.Forwarded, Root: root, Log: n.log, Registerer: n.cfg.Metrics,
		OwnerWait: n.store.OwnerWait, LockTTL: n.store.LockTTL()})
	shardProps := supervisor.ShardPropsResolving(jobactor.NewJobProps(n.env, jobOpts...), n.log, n.resolver, onPool)
	for i := 0; i < n.cfg.JobShards; i++ {
		pid, err := root.SpawnNamed(shardProps, "jobs-"+strconv.Itoa(i))
		if err != nil {
			return fmt.Errorf("troupe: spawn job shard: %w", err)
		}
		n.shards = append(n.shards, pid)
	}
	var replay *signing.ReplayGuard
	if n.cfg.Verifier != nil {
		replay = signing.NewReplayGuard(n.cfg.ReplayWindow, n.cfg.ReplaySeen)
		_ = n.cfg.Metrics.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "troupe_replay_signatures_forgotten_total",
			Help: "Signatures the replay window forgot before their window ended because its seen-set was full.",
		}, func() float64 { return float64(replay.Forgotten()) }))
	}
	sigs, err := intake.NewSignatures(n.cfg.Verifier, replay, n.cfg.Metrics)
	if err != nil {
		return fmt.Errorf("troupe: %w", err)
	}
	own := prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_own_outcomes_skipped_total",
		Help: "Outcomes this node decided and told clients on the result subject, read back from the result stream and skipped."})
	_ = n.cfg.Metrics.Register(own)
	invalidHB := prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_heartbeats_invalid_total",
		Help: "Heartbeats ignored for an invalid worker id, pool name, labels or other field (intake.ValidateHeartbeat)."})
	invalidHB, _ = metricsx.Register(n.cfg.Metrics, invalidHB)
	n.intake = &intake.Intake{Env: n.env, Store: n.store, Shards: n.shards, Log: n.log, Signatures: sigs,
		DLQFailures: n.dlqMetrics(), OwnOutcomes: own, HeartbeatsRefused: invalidHB, FindWaiting: n.waitingNode,
		SubmitRoom: n.submitRoom}
	if !n.cfg.NoProcessedGuard {
		n.guard = intake.NewGuard(n.rdb, n.store.Keys().Prefix(), n.cfg.Metrics, n.log)
		n.guard.Start()
		n.intake.Guard = n.guard
	}
	intakeRef.Store(n.intake)

	inputs, err := n.intake.Subscribe(n.nc, n.subj, n.cfg.NodeID)
	if err != nil {
		return fmt.Errorf("troupe: %w", err)
	}
	routerPID, sysRoot := n.router, n.sys.Root
	capSub, err := n.nc.Subscribe(n.subj.Capacity(), func(m *nats.Msg) {
		if !sigs.FromNode(intake.KindCapacity, m) {
			return
		}
		pl, err := router.DecodePeerLoad(m.Data)
		if err != nil {
			n.log.Debug("capacity report dropped", "err", err)
			return
		}
		pl.At = time.Now()
		sysRoot.Send(routerPID, pl)
	})
	if err != nil {
		return fmt.Errorf("troupe: subscribe capacity reports: %w", err)
	}
	sysRoot.Send(routerPID, &router.Announce{})
	// The queue questions answer other replicas only: a waiting job's
	// tenant, topic and labels are not for everyone on the bus.
	askSub, err := n.nc.Subscribe(n.subj.QueueAsk(n.cfg.NodeID), func(m *nats.Msg) {
		if !sigs.FromNode(intake.KindQueue, m) {
			return
		}
		pos := n.localQueuePosition(string(m.Data))
		_ = m.Respond([]byte(strconv.Itoa(pos)))
	})
	if err != nil {
		return fmt.Errorf("troupe: subscribe queue questions: %w", err)
	}
	findSub, err := n.nc.Subscribe(n.subj.QueueFind(n.cfg.NodeID), func(m *nats.Msg) {
		if !sigs.FromNode(intake.KindQueue, m) {
			return
		}
		var body []byte
		if w := n.localWaiting(string(m.Data)); w != nil {
			body, _ = json.Marshal(w)
		}
		_ = m.Respond(body)
	})
	if err != nil {
		return fmt.Errorf("troupe: subscribe waiting-job questions: %w", err)
	}
	listSub, err := n.nc.Subscribe(n.subj.QueueList(n.cfg.NodeID), func(m *nats.Msg) {
		if !sigs.FromNode(intake.KindQueue, m) {
			return
		}
		var q waitListQuery
		if json.Unmarshal(m.Data, &q) != nil || q.Limit <= 0 {
			_ = m.Respond([]byte("[]"))
			return
		}
		body, _ := json.Marshal(n.localWaitingList(q.Tenant, min(q.Limit, maxWaitList)))
		_ = m.Respond(body)
	})
	if err != nil {
		return fmt.Errorf("troupe: subscribe waiting-list questions: %w", err)
	}
	n.subs = append(append(n.subs, inputs...), capSub, askSub, findSub, listSub)
	if err := n.nc.Flush(); err != nil {
		return fmt.Errorf("troupe: nats flush: %w", err)
	}

	cctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.bg.Add(1)
	go func() {
		defer n.bg.Done()
		recovery.RememberParked(cctx, n.store, n.cfg.NodeID, n.intake, n.log)
	}()
	kick, resume := bus.OnFetchError(func(error) {}), bus.ResumeOn(nil)
	if n.cfg.StreamCheck >= 0 {
		keeper := n.streamKeeper()
		n.keeper.Store(keeper)
		n.bg.Add(1)
		go func() {
			defer n.bg.Done()
			keeper.Run(cctx)
		}()
		kick = bus.OnFetchError(func(error) { keeper.Kick() })
		resume = bus.ResumeOn(keeper.Back)
	}
	if err := n.intake.Consume(cctx, n.js, n.cfg.StreamPrefix, n.holdSubmits, kick, resume); err != nil {
		return err
	}
	stale := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "troupe_stale_jobs",
		Help: "Jobs the due poller found overdue in its last tick (their owner did not act), by state."}, []string{"state"})
	if err := n.cfg.Metrics.Register(stale); err != nil {
		stale = nil
	}
	n.due = &recovery.DuePoller{Store: n.store, Intake: n.intake, NodeID: n.cfg.NodeID, Log: n.log, Every: n.cfg.DuePoll, Stale: stale,
		Slack: n.cfg.DueSlack}
	n.due.Start()
	if !n.cfg.NoSagas {
		n.sagas, err = saga.Start(saga.Config{System: n.sys, Store: n.store, JS: n.js, Subjects: n.subj,
			Policy: n.cfg.Policy, NodeID: n.cfg.NodeID, Metrics: n.cfg.Metrics, Log: n.log,
			StepBudget: n.cfg.SagaStepBudget, Poll: n.cfg.SagaPoll, Retention: n.cfg.SagaRetention})
		if err != nil {
			return fmt.Errorf("troupe: %w", err)
		}
	}
	n.log.Info("node started", "nats", connect.RedactURLs(n.nc.ConnectedUrl()), "subjects", n.subj.Prefix()+"sys.*",
		"streams", n.cfg.StreamPrefix)
	return nil
}

// dlqMetrics registers troupe_dlq_bytes (read from Redis at each scrape)
// and returns troupe_dlq_write_failures_total{reason}.
func (n *Node) dlqMetrics() *prometheus.CounterVec {
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_dlq_write_failures_total",
		Help: "Bad inputs dropped because their DLQ entry could not be written (logged at ERROR with size and hash)."},
		[]string{"reason"})
	_ = n.cfg.Metrics.Register(failures)
	st := n.store
	_ = n.cfg.Metrics.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "troupe_dlq_bytes",
		Help: "Bytes the DLQ's entries hold (bounded by the DLQ byte budget; -1: Redis did not answer)."},
		func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			b, err := st.DLQBytes(ctx)
			if err != nil {
				return -1
			}
			return float64(b)
		}))
	return failures
}

// streamKeeper returns the keeper that recreates the node's streams and
// consumers when they go missing while it runs, counted in
// troupe_streams_recreated_total{stream} and
// troupe_stream_consumers_recreated_total{stream}, and proves each accepts
// writes (troupe_stream_refusing{stream}, troupe_stream_probe_refusals_total
// {stream}). Until a missing one is back, or while one refuses writes,
// Ready reports the streams not ready.
func (n *Node) streamKeeper() *bus.StreamKeeper {
	streams := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_streams_recreated_total",
		Help: "Input streams this node found missing while running and recreated (the messages they held are lost)."},
		[]string{"stream"})
	consumers := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_stream_consumers_recreated_total",
		Help: "Durable consumers of the input streams this node found missing while running and recreated."},
		[]string{"stream"})
	_ = n.cfg.Metrics.Register(streams)
	_ = n.cfg.Metrics.Register(consumers)
	k := bus.NewStreamKeeper(n.js, n.cfg.StreamPrefix, n.subj, n.cfg.StreamReplicas, n.log)
	k.Every = n.cfg.StreamCheck
	refusing := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "troupe_stream_refusing",
		Help: "1 while this node's last write probe of an input stream was refused (the stream exists and refuses publishes)."},
		[]string{"stream"})
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_stream_probe_refusals_total",
		Help: "Write probes of an input stream that JetStream refused."}, []string{"stream"})
	_ = n.cfg.Metrics.Register(refusing)
	_ = n.cfg.Metrics.Register(refusals)
	k.OnProbe = func(_ bus.StreamKind, name string, err error) {
		if err != nil {
			refusing.WithLabelValues(name).Set(1)
			refusals.WithLabelValues(name).Inc()
			return
		}
		refusing.WithLabelValues(name).Set(0)
	}
	k.OnRecreated = func(_ bus.StreamKind, name, part string) {
		if part == bus.PartStream {
			streams.WithLabelValues(name).Inc()
		} else {
			consumers.WithLabelValues(name).Inc()
		}
	}
	resets := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_stream_resets_total",
		Help: "Input streams found to be new ones (recreated here or elsewhere): the messages the old ones held are lost."},
		[]string{"stream"})
	_ = n.cfg.Metrics.Register(resets)
	k.OnReset = func(kind bus.StreamKind, name string) {
		resets.WithLabelValues(name).Inc()
		if kind == bus.StreamResult {
			n.bg.Add(1)
			go n.resultsLost(name)
		}
	}
	return k
}

// resultsLost tells every job this node owns that is with its worker —
// live, or parked here — that the result stream is a new one: a result its
// worker sent to the old one may be gone. Jobs on workers that dedupe ask
// them again (lifecycle.Job.onResultsLost); the others wait as before.
func (n *Node) resultsLost(stream string) {
	defer n.bg.Done()
	n.intake.TellLive(&jobactor.ResultsLost{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	count := 0
	err := n.store.ParkedIn(ctx, n.cfg.NodeID, func(ids []string) {
		count += len(ids)
		for _, id := range ids {
			n.intake.TellSpawn(id, &jobactor.ResultsLost{})
		}
	}, jobstate.StateDispatched, jobstate.StateRunning)
	if err != nil {
		n.log.Warn("reading this node's parked jobs after a result stream reset failed; they wait for their results or deadlines",
			"stream", stream, "err", err)
		return
	}
	n.log.Warn("result stream reset: jobs with their workers told (deduping workers are asked again)",
		"stream", stream, "parked", count)
}

// dataLostRecently reports whether Redis lost its data within the
// retention of terminal records: an event for a job with no record is then
// a job whose record was lost, not one that never existed.
func (n *Node) dataLostRecently() bool {
	at := n.dataLostAt.Load()
	return at > 0 && time.Since(time.UnixMilli(at)) < max(n.store.Retention(), time.Hour)
}

func (n *Node) connect(ctx context.Context) error {
	if n.cfg.NATS != nil {
		n.nc = n.cfg.NATS
	} else {
		for _, w := range n.cfg.NATSAuth.Warnings(n.cfg.NATSURL) {
			n.log.Warn(w)
		}
		nc, err := connect.DialNATS(n.cfg.NATSURL, n.cfg.NATSAuth, nats.Name("troupe-node "+n.cfg.NodeID),
			nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
		if err != nil {
			return fmt.Errorf("troupe: %w", err)
		}
		n.nc, n.ownNC = nc, true
	}
	js, err := jetstream.New(n.nc)
	if err != nil {
		return fmt.Errorf("troupe: jetstream: %w", err)
	}
	n.js = js
	if n.cfg.Redis != nil {
		n.rdb = n.cfg.Redis
		if err := n.rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("troupe: redis: %w", err)
		}
		return nil
	}
	for _, w := range n.cfg.RedisAuth.Warnings(n.cfg.RedisURL) {
		n.log.Warn(w)
	}
	rdb, err := connect.DialRedis(ctx, n.cfg.RedisURL, n.cfg.RedisAuth)
	if err != nil {
		return fmt.Errorf("troupe: %w", err)
	}
	n.rdb, n.ownRDB = rdb, true
	return nil
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
// writes and closes the connections the node opened. It waits for the actors
// at most until ctx ends (`troupe node` gives it 10 s on SIGTERM); whatever
// has not stopped by then keeps its locks until they expire.
func (n *Node) Stop(ctx context.Context) error {
	n.stopOnce.Do(func() {
		n.stopping.Store(true)
		if n.cancel != nil {
			n.cancel()
		}
		if n.stopProbe != nil {
			close(n.stopProbe)
		}
		n.bg.Wait()
		// Every subscription but the inbox ends now. The inbox stays until
		// the actors' locks are released (after the writer's flush), and
		// meanwhile refuses forwarded events at once (intake.Drain): a
		// replica forwarding a result for a job still locked here hears a
		// refusal and offers it again a second later, instead of "no
		// responders", which would make it wait for this node's lease to
		// go stale (up to LockTTL/3 + 2 s).
		var inbox []*nats.Subscription
		for _, s := range n.subs {
			if s.Subject == n.subj.Inbox(n.cfg.NodeID) {
				inbox = append(inbox, s)
				continue
			}
			_ = s.Unsubscribe()
		}
		if n.intake != nil {
			n.intake.Drain()
		}
		if n.beforeActorsStop != nil {
			n.beforeActorsStop()
		}
		if n.due != nil {
			n.due.Stop()
		}
		if n.sagas != nil {
			_ = n.sagas.Stop(ctx)
		}
		if n.snap != nil {
			n.snap.Stop()
		}
		if n.pools != nil {
			n.pools.Stop()
		}
		if n.sys != nil {
			// Stop every shard at once (each stops its job actors, which
			// release their locks through the writer), bounded by ctx.
			var wg sync.WaitGroup
			for _, pid := range append(n.shards, n.router) {
				wg.Add(1)
				go func(f *actor.Future) {
					defer wg.Done()
					_ = f.Wait()
				}(n.sys.Root.PoisonFuture(pid))
			}
			stopped := make(chan struct{})
			go func() { wg.Wait(); close(stopped) }()
			select {
			case <-stopped:
			case <-ctx.Done():
				n.log.Warn("stop: actors still stopping at the deadline; locks left will expire", "err", ctx.Err())
			}
			jobtrace.FromSystem(n.sys).Close() // job actors have stopped: write their last traces
			n.sys.Shutdown()
		}
		if n.resolver != nil {
			n.resolver.Stop()
		}
		if n.wheel != nil {
			n.wheel.Stop()
		}
		if n.env != nil && n.env.Toucher != nil {
			n.env.Toucher.Stop()
		}
		if n.dispatcher != nil {
			n.dispatcher.Close()
		}
		if n.scans != nil {
			n.scans.Stop()
		}
		if n.writer != nil {
			n.writer.Close()
		}
		for _, s := range inbox {
			_ = s.Unsubscribe() // the locks are released: see above
		}
		if n.guard != nil {
			n.guard.Stop() // after the actors: their last acks are queued
		}
		if n.renewer != nil {
			n.renewer.Stop()
		}
		n.stopTracing(ctx)
		for _, release := range n.unsign {
			release()
		}
		if n.ownNC && n.nc != nil {
			_ = n.nc.Drain()
		}
		if n.ownRDB && n.rdb != nil {
			_ = n.rdb.Close()
		}
	})
	return nil
}
