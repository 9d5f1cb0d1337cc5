package troupe

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/jobtrace"
	"github.com/troupe-run/troupe/internal/keyslot"
	"github.com/troupe-run/troupe/internal/logx"
	"github.com/troupe-run/troupe/internal/recovery"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/proto/capv1"
)

// parts lists the node's components in start order; the node stops them in
// the reverse order. What stops late starts early: the connections, the
// node lease (renewer) and the writer outlive the job actors, whose locks
// are released through the writer; the inputs (subscriptions, fetch loops,
// pollers) start last and stop first.
func (n *Node) parts() []component {
	list := []component{
		n.connectionsPart(), // NATS, JetStream, Redis
		n.signingPart(),     // bus.SignAs under the node's sender ids
		n.tracingPart(),     // the OpenTelemetry provider the node owns
		n.storePart(),       // scripts loaded, streams ensured
		n.renewerPart(),     // job locks and the node lease
	}
	if !n.cfg.Tuning.NoProcessedGuard {
		list = append(list, n.guardPart()) // processed-message marks
	}
	list = append(list,
		n.inboxPart(),       // closes the forwarding inbox once the locks are released
		n.writerPart(),      // batched Redis writes
		n.actorSystemPart(), // protoactor
	)
	if n.cfg.Output != nil {
		list = append(list, n.scanPoolPart()) // output content scans
	}
	list = append(list,
		n.dispatcherPart(),    // the job actors' goroutine pool
		n.toucherPart(),       // keeps unwritten waits' submits in progress
		n.wheelPart(),         // job timers
		n.routerPart(),        // the pools watcher and the router actor
		n.snapshotPart(),      // the router's snapshot in Redis
		n.policyWaitersPart(), // wakes jobs waiting on a policy; Node.Wait's poller
		n.ratesPart(),         // rate limit buckets
		n.jobEnvPart(),        // what the job actors share
		n.resolverPart(),      // forwards events of jobs owned elsewhere
		n.jobShardsPart(),     // the job supervisors and their actors
		n.intakePart(),        // heartbeats, progress, the inbox
		n.tickerPart(),        // delayed and scheduled jobs; the intake's delay hook
		n.questionsPart(),     // capacity gossip and other replicas' queue questions
		n.parkedPart(),        // remembers this node's parked jobs
		n.aloneWaitsPart(),    // ends the waits left alone here if Redis loses them
	)
	if n.cfg.Tuning.StreamCheck >= 0 {
		list = append(list, n.streamKeeperPart()) // recreates lost streams
	}
	list = append(list,
		n.consumePart(), // the submit, result and cancel fetch loops
		n.duePart(),     // the due poller
	)
	if !n.cfg.Tuning.NoSagas {
		list = append(list, n.sagasPart()) // rollbacks
	}
	return list
}

// goPart runs loop on a goroutine until the part stops.
func goPart(name string, loop func(ctx context.Context)) part {
	var (
		cancel context.CancelFunc
		wg     sync.WaitGroup
	)
	return part{name: name,
		start: func(context.Context) error {
			var ctx context.Context
			ctx, cancel = context.WithCancel(context.Background())
			wg.Add(1)
			go func() {
				defer wg.Done()
				loop(ctx)
			}()
			return nil
		},
		stop: func(context.Context) error {
			cancel()
			wg.Wait()
			return nil
		}}
}

func (n *Node) connectionsPart() part {
	return part{name: "connections",
		start: func(ctx context.Context) error {
			err := n.connect(ctx)
			if err != nil {
				n.closeConnections()
			}
			return err
		},
		stop: func(context.Context) error { n.closeConnections(); return nil }}
}

// closeConnections closes the connections the node opened.
func (n *Node) closeConnections() {
	if n.ownNC && n.nc != nil {
		_ = n.nc.Drain()
	}
	if n.ownRDB && n.rdb != nil {
		_ = n.rdb.Close()
	}
}

func (n *Node) connect(ctx context.Context) error {
	if n.cfg.NATS != nil {
		n.nc = n.cfg.NATS
	} else {
		for _, w := range n.cfg.NATSAuth.conn().Warnings(n.cfg.NATSURL) {
			n.log.Warn(w)
		}
		nc, err := connect.DialNATS(n.cfg.NATSURL, n.cfg.NATSAuth.conn(), nats.Name("troupe-node "+n.cfg.NodeID),
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
	for _, w := range n.cfg.RedisAuth.conn().Warnings(n.cfg.RedisURL) {
		n.log.Warn(w)
	}
	rdb, err := connect.DialRedis(ctx, n.cfg.RedisURL, n.cfg.RedisAuth.conn())
	if err != nil {
		return fmt.Errorf("troupe: %w", err)
	}
	n.rdb, n.ownRDB = rdb, true
	return nil
}

func (n *Node) signingPart() part {
	var unsign []func()
	return part{name: "signing",
		start: func(context.Context) error {
			if n.cfg.Signer != nil {
				// Everything the node publishes goes through bus.Encode* under one
				// of these sender ids (the saga runner's is set in saga/rollback.go).
				unsign = append(unsign, bus.SignAs(n.cfg.NodeID, n.cfg.Signer),
					bus.SignAs("troupe-saga/"+n.cfg.NodeID, n.cfg.Signer))
			}
			return nil
		},
		stop: func(context.Context) error {
			for _, release := range unsign {
				release()
			}
			return nil
		}}
}

func (n *Node) tracingPart() part {
	return part{name: "tracing",
		start: func(ctx context.Context) (err error) {
			n.jobSpans, err = n.startTracing(ctx)
			return err
		},
		stop: func(ctx context.Context) error { n.stopTracing(ctx); return nil }}
}

func (n *Node) storePart() part {
	return part{name: "store", start: func(ctx context.Context) error {
		n.store = store.New(n.rdb, store.Config{Prefix: n.cfg.KeyPrefix, LockTTL: n.cfg.Tuning.LockTTL, RescueAfter: n.cfg.Tuning.RescueAfter,
			DLQMaxBytes: n.cfg.Tuning.DLQMaxBytes, Retention: n.cfg.Tuning.Retention, DLQRetention: n.cfg.Tuning.DLQRetention})
		if err := n.store.LoadScripts(ctx); err != nil {
			return err
		}
		n.checkRecordEncoding(ctx)
		return bus.EnsureStreamsWith(ctx, n.js, n.cfg.StreamPrefix, n.subj,
			bus.StreamSettings{Replicas: n.cfg.Tuning.StreamReplicas, MaxBytes: n.cfg.Tuning.StreamMaxBytes})
	}}
}

// renewerPart keeps the job locks and the node lease; its Stop gives the
// lease up.
func (n *Node) renewerPart() part {
	return part{name: "renewer",
		start: func(context.Context) error {
			n.renewer = n.store.NewLockRenewer(n.log)
			n.renewer.KeepNodeLease(n.cfg.NodeID)
			dataLoss := prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_redis_data_loss_total",
				Help: "Times this node saw Redis lose its data (the epoch key vanished)."})
			_ = n.cfg.Metrics.Register(dataLoss)
			n.alone, n.aloneLost = jobactor.NewAloneWaits(), make(chan time.Time, 1)
			n.lostWaitsWoken = prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_lost_waits_woken_total",
				Help: "Jobs this node left waiting alone (a parked retry, an approval, a rate-limited park) woken to end state_lost after Redis lost their records."})
			_ = n.cfg.Metrics.Register(n.lostWaitsWoken)
			n.lostWaitSweeps = prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_lost_wait_sweeps_total",
				Help: "Sweeps of this node's waits left alone after it saw Redis lose its data (done, whether or not any was lost)."})
			_ = n.cfg.Metrics.Register(n.lostWaitSweeps)
			_ = n.cfg.Metrics.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "troupe_waits_alone",
				Help: "Jobs this node left waiting alone (no actor, no worker) and remembers, to end them if Redis loses their records."},
				func() float64 { return float64(n.alone.Len()) }))
			n.renewer.OnDataLoss(func() {
				dataLoss.Inc()
				n.dataLostAt.Store(time.Now().UnixMilli())
				select {
				case n.aloneLost <- n.renewer.IntactAt():
				default: // a sweep is already owed; it reads the index then
				}
			})
			n.renewer.Start()
			n.registerRenewMetrics()
			return nil
		},
		stop: func(context.Context) error { n.renewer.Stop(); return nil }}
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

// guardPart stops after the job actors: their last acks are queued.
func (n *Node) guardPart() part {
	return part{name: "processed-guard",
		start: func(context.Context) error {
			n.guard = intakeGuard(n)
			n.guard.Start()
			return nil
		},
		stop: func(context.Context) error { n.guard.Stop(); return nil }}
}

// inboxPart unsubscribes the node's forwarding inbox (subscribed by the
// intake) once the job actors have stopped and the writer has flushed
// their lock releases. Until then the inbox refuses forwarded events at
// once (intake.Drain): a replica forwarding a result for a job still
// locked here hears a refusal and offers it again a second later, instead
// of "no responders", which would make it wait for this node's lease to
// go stale (up to LockTTL/3 + 2 s).
func (n *Node) inboxPart() part {
	return stopOnly("inbox", func(context.Context) error {
		for _, s := range n.inbox {
			_ = s.Unsubscribe()
		}
		n.inbox = nil
		return nil
	})
}

func (n *Node) writerPart() part {
	return part{name: "writer",
		start: func(context.Context) error { n.writer = n.store.NewWriter(0, 0, 0); return nil },
		stop:  func(context.Context) error { n.writer.Close(); return nil }}
}

func (n *Node) actorSystemPart() part {
	return part{name: "actor-system",
		start: func(context.Context) error {
			// protoactor logs every restart and dead letter at Info; the node keeps
			// it to warnings so its own lines stay readable under load.
			actorLog := n.log.With("lib", "protoactor")
			n.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
				return slog.New(logx.LevelFloor(actorLog.Handler(), slog.LevelWarn))
			}))
			// An actor per job registered by name: one warm registry, not
			// protoactor's 32,768 small maps (see CompactRegistry).
			supervisor.CompactRegistry(n.sys, supervisor.RegistryBuckets)
			return nil
		},
		stop: func(context.Context) error { n.sys.Shutdown(); return nil }}
}

func (n *Node) scanPoolPart() part {
	return part{name: "scan-pool",
		start: func(context.Context) error { n.scans = jobactor.NewScanPool(scanWorkers, scanQueue); return nil },
		stop:  func(context.Context) error { n.scans.Stop(); return nil }}
}

func (n *Node) dispatcherPart() part {
	return part{name: "job-dispatcher",
		start: func(context.Context) error { n.dispatcher = supervisor.NewPoolDispatcher(); return nil },
		stop:  func(context.Context) error { n.dispatcher.Close(); return nil }}
}

func (n *Node) toucherPart() part {
	return part{name: "toucher",
		start: func(context.Context) error {
			t := jobactor.NewToucher(touchFor(n.cfg.Tuning.CapacityGrace))
			n.toucher = t
			_ = n.cfg.Metrics.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "troupe_capacity_submit_touches_total",
				Help: "In-progress signals sent to JetStream for the submits of jobs waiting within their capacity grace that came other than through the node's submit fetch loops (those keep their own in progress: troupe_submit_progress_touches_total).",
			}, func() float64 { return float64(t.Touches()) }))
			return nil
		},
		stop: func(context.Context) error { n.toucher.Stop(); return nil }}
}

func (n *Node) wheelPart() part {
	return part{name: "wheel",
		start: func(context.Context) error { n.wheel = jobactor.NewWheel(n.sys.Root); return nil },
		stop:  func(context.Context) error { n.wheel.Stop(); return nil }}
}

// routerPart loads the pools (file and runtime mappings), spawns the router
// and starts the pools watcher feeding it.
func (n *Node) routerPart() part {
	return part{name: "router",
		start: func(ctx context.Context) error {
			path := ""
			if n.poolsFromFile {
				path = n.cfg.PoolsFile
			}
			watcher, err := router.NewPoolsWatcher(router.PoolsWatcherConfig{Path: path, Base: n.cfg.routing,
				Mappings: router.NewMappingStore(n.rdb, n.cfg.KeyPrefix), Log: n.log,
				Extra: n.poolsExtra, OnApply: n.poolsApplied})
			if err != nil {
				return err
			}
			pools, err := watcher.Load(ctx)
			if err != nil {
				return err
			}
			n.pools = watcher
			// What the router hears of each worker, for direct dispatches to carry.
			n.beats = router.NewBeats()
			n.router = n.sys.Root.SpawnPrefix(router.Props(router.Config{
				Pools: pools, TTL: n.cfg.Tuning.WorkerTTL, Direct: n.subj.Worker, PoolSubj: n.subj.Pool, Log: n.log,
				Metrics: n.cfg.Metrics, NodeID: n.cfg.NodeID, Bounds: registry.Bounds{MaxWorkers: n.cfg.Tuning.MaxWorkers, MaxPools: n.cfg.Tuning.MaxPools},
				// A pick its job has neither started on nor given back a minute
				// after the dispatch timeout was never dispatched (router/picks.go).
				PickTTL: n.cfg.Tuning.Timeouts.Dispatch + time.Minute,
				Gossip:  func(data []byte) { _ = n.nc.PublishMsg(bus.NewSignedMsg(n.subj.Capacity(), n.cfg.NodeID, data)) },
				OnPeers: n.peersSeen,
				Link:    func() (bool, uint64) { return n.nc.IsConnected(), n.nc.Stats().Reconnects },
				Heard:   func() uint64 { return n.nc.Stats().InMsgs },
				Beats:   n.beats,
				// The router learns of evictions on its own goroutine; the jobs
				// still waiting on an evicted worker are told through their
				// shards (no spawn: a job with no live actor here is not
				// waiting on this node).
				OnEvictJobs: func(workerID string, jobIDs []string, evictedAt time.Time) {
					if in := n.intakeRef.Load(); in != nil {
						for _, id := range jobIDs {
							in.Tell(id, &jobactor.WorkerLost{WorkerID: workerID, At: evictedAt})
						}
					}
				},
			}), "router")
			n.pools.Start(n.sys.Root, n.router)
			return nil
		},
		stop: func(ctx context.Context) error {
			n.pools.Stop()
			n.stopActors(ctx, n.router)
			return nil
		}}
}

func (n *Node) snapshotPart() part {
	return part{name: "router-snapshot",
		start: func(ctx context.Context) (err error) {
			n.snap, err = router.NewSnapshotWriter(router.SnapshotWriterConfig{Redis: n.rdb, Prefix: n.cfg.KeyPrefix,
				NodeID: n.cfg.NodeID, Root: n.sys.Root, Router: n.router, Log: n.log})
			if err != nil {
				return err
			}
			n.snap.WarmStart(ctx)
			n.snap.Start()
			return nil
		},
		stop: func(context.Context) error { n.snap.Stop(); return nil }}
}

// policyWaitersPart wakes the jobs waiting on an unavailable policy once it
// answers, and polls Redis for the jobs callers of Node.Wait wait on.
func (n *Node) policyWaitersPart() part {
	var (
		stop chan struct{}
		wg   sync.WaitGroup
	)
	return part{name: "waiters",
		start: func(context.Context) error {
			n.safetyWaiters = jobactor.NewSafetyWaiters()
			stop = make(chan struct{})
			root, sw := n.sys.Root, n.safetyWaiters
			wg.Add(2)
			go func() {
				defer wg.Done()
				sw.Probe(root, stop)
			}()
			go func() {
				defer wg.Done()
				n.waiters.poll(stop, n.store)
			}()
			return nil
		},
		stop: func(context.Context) error {
			close(stop)
			wg.Wait()
			return nil
		}}
}

// jobEnvPart builds what every job actor shares, and its gauges.
func (n *Node) jobEnvPart() part {
	var (
		stopKeys context.CancelFunc
		keysDone chan struct{}
	)
	return part{name: "job-env", stop: func(context.Context) error {
		if stopKeys != nil {
			stopKeys()
			<-keysDone
		}
		return nil
	}, start: func(context.Context) error {
		if n.keysOn {
			n.keySlots = keyslot.New(n.rdb, n.store.Keys().Prefix())
			n.keyWaiters = jobactor.NewKeyWaiters()
			var ctx context.Context
			ctx, stopKeys = context.WithCancel(context.Background())
			keysDone = make(chan struct{})
			root, kw, slots, log := n.sys.Root, n.keyWaiters, n.keySlots, n.log
			go func() {
				defer close(keysDone)
				kw.Run(ctx, root, slots, func(err error) { log.Warn("concurrency key wakes: subscription lost", "err", err) })
			}()
		}
		n.env = (&jobactor.Env{
			NodeID: n.cfg.NodeID, Writer: n.writer, Renewer: n.renewer, Router: n.router, Policy: n.cfg.Policy,
			Subjects: n.subj, Publish: n.nc.Publish, Log: n.log, Root: n.sys.Root,
			Keys: n.store.Keys(), Wheel: n.wheel, Metrics: jobactor.NewMetrics(n.cfg.Metrics), Timeouts: (*jobactor.Timeouts)(n.cfg.Tuning.Timeouts),
			Forward: intakeForwarder(n), Redispatch: redispatch(n.cfg.Tuning.NoRedispatchTopics),
			Retry:       n.retryPolicy,
			TenantLimit: tenantLimit(n.cfg.Tuning.TenantLimits), Rates: n.rates,
			KeyLimit: n.keyLimitNow(), KeySlots: n.keySlots, KeyWaiters: n.keyWaiters,
			Output: n.outputGate(), Scans: n.scans,
			Tuning: n.cfg.Tuning.jobs(), Backoff: n.cfg.backoff,
			Connected: n.nc.IsConnected, SafetyWaiters: n.safetyWaiters,
			DispatchStamp: n.beats.Stamp,
			DataLost:      n.dataLostRecently, Alone: n.alone, OnTerminal: n.waiters.ended, Tracing: n.jobSpans,
			OwnerWait: n.store.OwnerWait, LockTTL: n.store.LockTTL(), Toucher: n.toucher,
		}).WithDefaults()
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
		return nil
	}}
}

func (n *Node) resolverPart() part {
	return part{name: "resolver",
		start: func(context.Context) error {
			n.resolver = supervisor.NewResolver(supervisor.ResolverConfig{NodeID: n.cfg.NodeID, Holders: n.store.LockHolders,
				ForwardBatch: intakeBatchForwarder(n), Forwarded: n.env.Metrics.Forwarded, Root: n.sys.Root, Log: n.log,
				Registerer: n.cfg.Metrics, OwnerWait: n.store.OwnerWait, LockTTL: n.store.LockTTL()})
			return nil
		},
		stop: func(context.Context) error { n.resolver.Stop(); return nil }}
}

// jobShardsPart spawns the job supervisors. Its Stop stops every shard at
// once (each stops its job actors, which release their locks through the
// writer), bounded by ctx, then writes the job traces' last entries.
func (n *Node) jobShardsPart() part {
	return part{name: "job-shards",
		start: func(context.Context) error {
			onPool := supervisor.OnPool(n.dispatcher)
			tc := jobtrace.Config{Enabled: n.cfg.Tuning.JobTrace}
			tc.Redis, tc.Keys, tc.NodeID, tc.Retention = n.rdb, n.store.Keys(), n.cfg.NodeID, n.store.Retention()
			tc.Log, tc.Metrics, tc.Origin = n.log, n.cfg.Metrics, jobactor.TraceOrigin
			tracer, err := jobtrace.New(n.sys, tc) // nil when off: no middleware at all
			if err != nil {
				return err
			}
			jobOpts := append([]actor.PropsOption{onPool}, tracer.PropsOptions()...)
			shardProps := supervisor.ShardPropsResolving(jobactor.NewJobProps(n.env, jobOpts...), n.log, n.resolver, onPool)
			for i := 0; i < n.cfg.Tuning.JobShards; i++ {
				pid, err := n.sys.Root.SpawnNamed(shardProps, "jobs-"+strconv.Itoa(i))
				if err != nil {
					n.stopActors(context.Background(), n.shards...)
					return err
				}
				n.shards = append(n.shards, pid)
			}
			return nil
		},
		stop: func(ctx context.Context) error {
			n.stopActors(ctx, n.shards...)
			jobtrace.FromSystem(n.sys).Close() // job actors have stopped: write their last traces
			return nil
		}}
}

// stopActors stops pids at once and waits for them, at most until ctx ends.
func (n *Node) stopActors(ctx context.Context, pids ...*actor.PID) {
	var wg sync.WaitGroup
	for _, pid := range pids {
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
}

// parkedPart reads this node's parked jobs into its shards' memory.
func (n *Node) parkedPart() part {
	return goPart("parked-jobs", func(ctx context.Context) {
		recovery.RememberParked(ctx, n.store, n.cfg.NodeID, n.intake, n.log)
	})
}

// streamKeeperPart recreates lost streams and probes them (Ready reports a
// stream refusing writes); its Stop also waits for the result-stream reset
// handling it started (resultsLost).
func (n *Node) streamKeeperPart() part {
	var (
		cancel context.CancelFunc
		wg     sync.WaitGroup
	)
	return part{name: "stream-keeper",
		start: func(context.Context) error {
			keeper := n.streamKeeper()
			n.keeper.Store(keeper)
			var ctx context.Context
			ctx, cancel = context.WithCancel(context.Background())
			wg.Add(1)
			go func() {
				defer wg.Done()
				keeper.Run(ctx)
			}()
			return nil
		},
		stop: func(context.Context) error {
			cancel()
			wg.Wait()
			n.bg.Wait()
			return nil
		}}
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
	k := bus.NewStreamKeeper(n.js, n.cfg.StreamPrefix, n.subj, n.cfg.Tuning.StreamReplicas, n.log)
	k.MaxBytes = n.cfg.Tuning.StreamMaxBytes
	k.Every = n.cfg.Tuning.StreamCheck
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

// consumePart starts the fetch loops of the submit, result and cancel
// streams; a failed fetch makes the stream keeper look at once.
func (n *Node) consumePart() part {
	var cancel context.CancelFunc
	return part{name: "consume",
		start: func(context.Context) error {
			kick, resume := bus.OnFetchError(func(error) {}), bus.ResumeOn(nil)
			if keeper := n.keeper.Load(); keeper != nil {
				kick = bus.OnFetchError(func(error) { keeper.Kick() })
				resume = bus.ResumeOn(keeper.Back)
			}
			var ctx context.Context
			ctx, cancel = context.WithCancel(context.Background())
			if err := n.intake.Consume(ctx, n.js, n.cfg.StreamPrefix, n.holdSubmits, kick, resume); err != nil {
				cancel()
				return err
			}
			return nil
		},
		stop: func(context.Context) error { cancel(); return nil }}
}

func (n *Node) duePart() part {
	return part{name: "due-poller",
		start: func(context.Context) error {
			stale := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "troupe_stale_jobs",
				Help: "Jobs the due poller found overdue in its last tick (their owner did not act), by state."}, []string{"state"})
			if err := n.cfg.Metrics.Register(stale); err != nil {
				stale = nil
			}
			n.due = &recovery.DuePoller{Store: n.store, Intake: n.intake, NodeID: n.cfg.NodeID, Log: n.log, Every: n.cfg.Tuning.DuePoll,
				IdleEvery: n.cfg.Tuning.DueIdlePoll, Stale: stale, Slack: n.cfg.Tuning.DueSlack, Housekeep: n.repairKeySlots}
			n.due.Start()
			n.duePoked.Store(n.due)
			return nil
		},
		stop: func(context.Context) error { n.duePoked.Store(nil); n.due.Stop(); return nil }}
}

func (n *Node) sagasPart() part {
	return part{name: "sagas",
		start: func(context.Context) (err error) {
			n.sagas, err = saga.Start(saga.Config{System: n.sys, Store: n.store, JS: n.js, Subjects: n.subj,
				Policy: n.cfg.Policy, NodeID: n.cfg.NodeID, Metrics: n.cfg.Metrics, Log: n.log,
				StepBudget: n.cfg.Tuning.SagaStepBudget, Poll: n.cfg.Tuning.SagaPoll, Retention: n.cfg.Tuning.SagaRetention})
			return err
		},
		stop: func(ctx context.Context) error { return n.sagas.Stop(ctx) }}
}

// retryPolicies is each job's retry policy: its topic's (pools.yaml key
// retries), overridden by its meta.labels (intake refused labels that do
// not parse; such a job keeps its topic's).
func retryPolicies(topics map[string]jobstate.RetryPolicy) func(req *capv1.JobRequest) jobstate.RetryPolicy {
	return func(req *capv1.JobRequest) jobstate.RetryPolicy {
		p, _ := jobstate.RetryPolicyOf(req, topics[req.GetTopic()])
		return p
	}
}
