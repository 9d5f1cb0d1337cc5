package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe/bus"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

func runWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	var c common
	c.register(fs, true, false)
	id := fs.String("id", "", "worker id (default worker-<random>)")
	pool := fs.String("pool", "default", "pool name announced in heartbeats")
	topics := fs.String("topics", "job.echo,job.sleep", "comma-separated job topics (pool subjects) to take")
	handler := fs.String("handler", "echo", "echo (succeed at once) or sleep")
	sleep := fs.Duration("sleep", time.Second, "how long the sleep handler takes")
	direct := fs.Bool("direct", true, "also take jobs on worker.<id>.jobs (announced with label troupe.dispatch=direct)")
	hb := fs.Duration("heartbeat", worker.HeartbeatDefault, "heartbeat interval")
	maxPar := fs.Int("max-parallel", 64, "jobs run at once")
	labels := labelsFlag{}
	fs.Var(labels, "label", "worker label key=value (repeatable)")
	_ = fs.Parse(args)
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
	default:
		return fmt.Errorf("unknown handler %q (echo or sleep)", *handler)
	}
	nc, err := nats.Connect(c.nats, nats.Name("troupe-worker "+*id), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect nats: %w", err)
	}
	defer nc.Close()
	w, err := worker.Start(nc, worker.Config{ID: *id, Pool: *pool, Topics: strings.Split(*topics, ","),
		Direct: *direct, Subjects: bus.NewSubjects(c.subjPrefix), Handler: h, Heartbeat: *hb,
		MaxParallel: int32(*maxPar), Labels: labels, Progress: *handler == "sleep",
		OnReceive: func(subject string, req *capv1.JobRequest) {
			log.Debug("job received", "job_id", req.JobId, "topic", req.Topic, "subject", subject)
		}})
	if err != nil {
		return err
	}
	log.Info("worker running", "worker_id", *id, "pool", *pool, "topics", *topics, "direct", *direct)
	<-ctx.Done()
	w.Stop()
	return nil
}
