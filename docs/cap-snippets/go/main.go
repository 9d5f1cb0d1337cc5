// A stock CAP Go worker of pool "echo" taking topic job.echo, with the
// heartbeat Troupe needs (CAP SDK: cordum-io/cap at d880483, module github.com/cordum-io/cap/v2).
package main

import (
	"context"
	"log"
	"os"
	"os/signal"
	"sync/atomic"

	agentv1 "github.com/cordum-io/cap/v2/cordum/agent/v1"
	"github.com/cordum-io/cap/v2/sdk/go/bus"
	"github.com/cordum-io/cap/v2/sdk/go/worker"
)

const (
	workerID = "echo-go-1" // unique, no '.'
	pool     = "echo"      // a pool name from pools.yaml
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	url := os.Getenv("NATS_URL")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	nc, err := bus.Connect(bus.Config{URL: url})
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	var active atomic.Int32 // reported as active_jobs
	w := &worker.Worker{
		NATS:     nc,
		Subject:  "job.echo", // the topic; queue group = subject
		SenderID: workerID,
		Handler: func(ctx context.Context, req *agentv1.JobRequest) (*agentv1.JobResult, error) {
			active.Add(1)
			defer active.Add(-1)
			return &agentv1.JobResult{JobId: req.JobId, Status: agentv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: req.ContextPtr}, nil
		},
	}
	if err := w.Start(); err != nil {
		log.Fatal(err)
	}

	// The Worker sends no heartbeat and runs one job at a time: announce 1.
	beat := func() ([]byte, error) {
		return worker.HeartbeatPayload(workerID, pool, int(active.Load()), 1, 0)
	}
	if b, err := beat(); err == nil {
		_ = worker.EmitHeartbeat(nc, b) // HeartbeatLoop's first beat comes one interval after start
	}
	worker.HeartbeatLoop(ctx, nc, beat) // every capsdk.DefaultHeartbeatInterval (5 s)
}
