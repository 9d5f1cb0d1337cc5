package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/signing"
)

func runNode(ctx context.Context, args []string) error {
	fs := newFlags("node")
	var c common
	c.register(fs, true, true)
	id := fs.String("id", envOr("TROUPE_NODE_ID", ""), "node id (default hostname-pid)")
	poolsFile := fs.String("pools", envOr("TROUPE_POOLS_FILE", ""), "pools.yaml (default: built-in routing for job.echo, job.sleep, job.bench)")
	timeouts := fs.String("timeouts", envOr("TROUPE_TIMEOUTS_FILE", ""), "timeouts.yaml (default: dispatch 300 s, running 9000 s)")
	lockTTL := fs.Duration("lock-ttl", 0, "job lock TTL (default 60s); a dead node's jobs are adopted 1–2 TTLs after it dies")
	workerTTL := fs.Duration("worker-ttl", 0, "how long a worker stays routable after its last heartbeat (default 30s); keep it at least three of the workers' heartbeat intervals (stock CAP workers beat every 5s)")
	resendAfter := fs.Duration("resend-after", 0, "how long a job directly dispatched to a deduping worker may wait for a sign of arrival before the dispatch is repeated (default 5s; negative: never)")
	parkAfter := fs.Duration("park-after", 0, "how long a job waiting for its worker keeps a live actor before it parks (default 10s; negative: never)")
	retryParkMin := fs.Duration("retry-park-min", 0, "the shortest retry backoff whose wait parks: the job's lock is released and its actor stops until its retry time (default 30s; negative: never)")
	workerLostGrace := fs.Duration("worker-lost-grace", 0, "how long a job started on a worker that was evicted waits for the worker's answer before it ends FAILED worker_lost (default 60s; negative: its running deadline decides)")
	capacityGrace := fs.Duration("capacity-grace", 0, "how long a new job that finds no room stays unwritten (its submit un-acked) before it is written SCHEDULED (default 1m for pool_overloaded, 2s for no_workers; its submit is kept in progress at JetStream meanwhile; negative: at once)")
	unknownHold := fs.Duration("unknown-hold", 0, "how long a result or cancel for a job with no record waits for a replica to recreate the record before it is dead-lettered (default 30s; negative: at once)")
	pprofListen := fs.String("pprof-listen", "", "serve Go's profiles (/debug/pprof/) on this loopback address, e.g. 127.0.0.1:6060 (\"\": off)")
	otlp := fs.String("otlp-endpoint", "", "OTLP/gRPC receiver for job traces: host:port or http://host:port (plaintext), https://host:port (TLS) (default OTEL_EXPORTER_OTLP_ENDPOINT; neither: tracing off)")
	retention := fs.Duration("retention", 0, "how long a finished job's record, history and trace stay readable (default 24h; negative: forever; env TROUPE_RETENTION)")
	dlqRetention := fs.Duration("dlq-retention", 0, "how long a DLQ entry is kept (default 0: no age limit, the DLQ's 64 MiB budget drops the oldest; env TROUPE_DLQ_RETENTION)")
	streamReplicas := fs.Int("stream-replicas", 1,
		"JetStream replicas of each stream (3 on a 3-server NATS cluster survives one server's loss)")
	streamMaxBytes := fs.Int64("stream-max-bytes", 0,
		"bound of each of the 3 input streams in bytes; JetStream reserves it from its file storage when a stream is made (default 256 MiB; lower it where many prefixes share one JetStream; at least 1 MiB)")
	var pf policyFlags
	pf.register(fs)
	var af adminFlags
	af.register(fs)
	var sf signFlags
	sf.register(fs, true, true)
	replayWindow := fs.Duration("replay-window", signing.DefaultReplaySkew,
		"with --verify-keys: how far a packet's created_at may be from its arrival; within it each signature is taken once")
	replaySeen := fs.Int("replay-seen", signing.DefaultReplaySeen,
		"with --verify-keys: how many signatures the replay window remembers at most")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := durationEnv(fs, "retention", "TROUPE_RETENTION", retention); err != nil {
		return err
	}
	if err := durationEnv(fs, "dlq-retention", "TROUPE_DLQ_RETENTION", dlqRetention); err != nil {
		return err
	}
	log := c.logger()
	otelErrorsTo(log)
	reg := prometheus.NewRegistry()
	conn, err := c.conns()
	if err != nil {
		return err
	}
	policy, closePolicy, err := pf.build(conn, c.keyPrefix, reg, log)
	if err != nil {
		return err
	}
	defer closePolicy()
	output, err := pf.buildOutput()
	if err != nil {
		return err
	}
	signer, err := sf.signer()
	if err != nil {
		return err
	}
	verifier, err := sf.verifier()
	if err != nil {
		return err
	}
	if verifier != nil && !verifier.KeySet().Roled() {
		log.Warn("--verify-keys lists no roles: every listed key may act as every role (node, worker, client, operator); see SECURITY.md, Roles and scopes")
	}
	if signer != nil && *id == "" {
		log.Warn("--sign-key without --id: the node signs as hostname-pid, which changes on restart; give it a stable --id and list it in the key sets")
	}
	// With --pools the node reads (and watches, and reloads on SIGHUP) the
	// file itself; without it, the built-in demo routing applies.
	var pools *troupe.Pools
	if *poolsFile == "" {
		if pools, err = loadPools(""); err != nil {
			return err
		}
	}
	node, err := troupe.NewNode(troupe.Config{NodeID: *id, NATSURL: conn.NATSURL, NATSAuth: natsAuth(conn.NATS), RedisURL: conn.RedisURL, RedisAuth: redisAuth(conn.Redis),
		KeyPrefix: c.keyPrefix, SubjectPrefix: c.subjPrefix, StreamPrefix: c.streamPrefix, Pools: pools, PoolsFile: *poolsFile, Logger: log,
		Policy: policy, Output: output, Metrics: reg, Signer: signer, Verifier: verifier, OTLPEndpoint: *otlp,
		Tuning: troupe.Tuning{TimeoutsFile: *timeouts, LockTTL: *lockTTL, WorkerTTL: *workerTTL, ParkAfter: *parkAfter, RetryParkMin: *retryParkMin, ResendAfter: *resendAfter,
			WorkerLostGrace: *workerLostGrace, UnknownHold: *unknownHold, CapacityGrace: *capacityGrace,
			StreamReplicas: *streamReplicas, StreamMaxBytes: *streamMaxBytes, Retention: *retention, DLQRetention: *dlqRetention,
			ReplayWindow: *replayWindow, ReplaySeen: *replaySeen}})
	if err != nil {
		return err
	}
	if err := node.Start(ctx); err != nil {
		return err
	}
	_, stopPprof, err := startPprof(*pprofListen, log)
	if err != nil {
		_ = node.Stop(context.Background())
		return err
	}
	defer stopPprof()
	stopAdmin, err := af.start(node, log)
	if err != nil {
		_ = node.Stop(context.Background())
		return err
	}
	// SIGHUP re-reads pools.yaml; an invalid file keeps the old config.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for done := false; !done; {
		select {
		case <-hup:
			if err := node.ReloadPools(); err != nil {
				log.Warn("pools reload refused; keeping the config in use", "err", err)
			} else {
				log.Info("pools reloaded")
			}
			if verifier != nil {
				if err := verifier.Reload(); err != nil {
					log.Warn("key set reload refused; keeping the keys in use", "err", err)
				} else {
					log.Info("key set reloaded", "senders", verifier.KeySet().Senders())
				}
			}
		case <-ctx.Done():
			done = true
		}
	}
	log.Info("stopping")
	stopAdmin()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return node.Stop(sctx)
}

// natsAuth and redisAuth hand the connection flags to the node.
func natsAuth(c connect.NATS) troupe.NATSAuth {
	return troupe.NATSAuth{User: c.User, Password: c.Password, PasswordFile: c.PasswordFile, Token: c.Token,
		TokenFile: c.TokenFile, NKeyFile: c.NKeyFile, CredsFile: c.CredsFile, TLS: troupe.TLSSettings(c.TLS)}
}

func redisAuth(c connect.Redis) troupe.RedisAuth {
	return troupe.RedisAuth{User: c.User, Password: c.Password, PasswordFile: c.PasswordFile, Cluster: c.Cluster,
		TLS: troupe.TLSSettings(c.TLS)}
}
