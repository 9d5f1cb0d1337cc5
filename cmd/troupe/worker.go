package main

import (
	"context"
	"fmt"
	"github.com/nats-io/nats.go"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

func runWorker(ctx context.Context, args []string) error {
	fs := newFlags("worker")
	var c common
	c.register(fs, true, false)
	id := fs.String("id", "", "worker id (default worker-<random>)")
	pool := fs.String("pool", "default", "the pool this worker joins (announced in heartbeats): the node routes a job's topic to pools (pools.yaml, troupe pool map) and picks a worker of the pool, whatever topics it lists")
	topics := fs.String("topics", "job.echo,job.sleep", "comma-separated topics whose subjects the worker also queue-subscribes to, for jobs the node publishes to a pool subject rather than to this worker (--direct); announced as the worker's capabilities. Not a filter: a job routed to --pool and sent directly runs whatever its topic")
	handler := fs.String("handler", "echo", "what each job does: echo (succeed at once, the result pointing at the input), sleep (succeed after --sleep), fail (end FAILED) or fatal (end FAILED_FATAL: a workflow step's failure rolls its saga back). Whatever the handler, a job's env switches it: demo.fail=1, demo.fatal=1, demo.sleep=<duration> (before the outcome), demo.error=<message> (set with troupe submit --env k=v)")
	sleep := fs.Duration("sleep", time.Second, "how long --handler sleep takes")
	direct := fs.Bool("direct", true, "take jobs the node sends to this worker alone, on worker.<id>.jobs (announced with label troupe.dispatch=direct)")
	hb := fs.Duration("heartbeat", worker.HeartbeatDefault, "heartbeat interval")
	reconnectWait := fs.Duration("reconnect-wait", nats.DefaultReconnectWait, "wait between attempts to reconnect to NATS")
	maxPar := fs.Int("max-parallel", 64, "jobs run at once")
	receipts := fs.String("receipts", "", "append every job id run to this file, a line each, and \"dup <id>\" for each repeated delivery deduped (fault tests count them)")
	dedupe := fs.Bool("dedupe", true, "run each job id once however often it is delivered, and announce it (label troupe.dedupe=job_id) so the node may repeat a dispatch that seems lost")
	labels := labelsFlag{}
	fs.Var(labels, "label", "worker label key=value (repeatable)")
	var sf signFlags
	sf.register(fs, true, true)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log := c.logger()
	if *id == "" {
		*id = newID("worker-")
	}
	var h worker.Handler
	switch *handler {
	case "echo":
		h = worker.Echo
	case "sleep":
		h = worker.Sleep(*sleep)
	case "fail", "fatal":
		h = worker.Fail(*handler == "fatal")
	default:
		return fmt.Errorf("unknown handler %q (echo, sleep, fail or fatal)", *handler)
	}
	h = worker.Demo(h)
	signer, err := sf.signer()
	if err != nil {
		return err
	}
	verifier, err := sf.verifier()
	if err != nil {
		return err
	}
	logReceipt, closeReceipts, err := receiptLog(*receipts)
	if err != nil {
		return err
	}
	defer closeReceipts()
	conn, err := c.conns()
	if err != nil {
		return err
	}
	// Named after the worker, reconnecting for ever; the error never
	// contains a secret.
	nc, err := connect.DialNATS(conn.NATSURL, conn.NATS, nats.Name("troupe-worker "+*id), nats.MaxReconnects(-1),
		nats.ReconnectWait(*reconnectWait))
	if err != nil {
		return err
	}
	defer nc.Close()
	w, err := worker.Start(nc, worker.Config{ID: *id, Pool: *pool, Topics: strings.Split(*topics, ","),
		Direct: *direct, SubjectPrefix: c.subjPrefix, Handler: h, Heartbeat: *hb,
		MaxParallel: int32(*maxPar), Labels: labels, Progress: *handler == "sleep",
		OnReceive: func(subject string, req *capv1.JobRequest) {
			log.Debug("job received", "job_id", req.JobId, "topic", req.Topic, "subject", subject)
			logReceipt(req.JobId)
		},
		Dedupe: *dedupe,
		OnDuplicate: func(subject string, req *capv1.JobRequest) {
			log.Debug("repeated delivery deduped", "job_id", req.JobId, "subject", subject)
			logReceipt("dup " + req.JobId)
		},
		Signer: signer, Verifier: verifier,
		OnReject: func(subject string, err error) {
			log.Warn("dispatch rejected: signature", "subject", subject, "err", err)
		}})
	if err != nil {
		return err
	}
	log.Info("worker running", "worker_id", *id, "pool", *pool, "topics", *topics, "direct", *direct)
	<-ctx.Done()
	w.Stop()
	return nil
}

// receiptLog opens path for appending one line per received job id. Each
// line is one write(2), so a worker killed with SIGKILL loses none it
// reported. An empty path logs nothing.
func receiptLog(path string) (func(jobID string), func(), error) {
	if path == "" {
		return func(string) {}, func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("receipts: %w", err)
	}
	var mu sync.Mutex
	return func(jobID string) {
		mu.Lock()
		_, _ = f.WriteString(jobID + "\n")
		mu.Unlock()
	}, func() { _ = f.Close() }, nil
}
