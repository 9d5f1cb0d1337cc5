// Command stockworker behaves as a worker written with a stock CAP SDK does,
// for the fault tests that kill one: it queue-subscribes to the pool subject
// of its topics (queue group = the subject), heartbeats its pool,
// max_parallel_jobs and active_jobs with no Troupe labels (no direct
// subject, no progress, no dedupe), hears no cancels, runs each job for
// --sleep and publishes a JobResult with its worker_id on sys.job.result
// with a core NATS publish. Every job id it receives is appended to
// --receipts, one write(2) per line, so a SIGKILL loses none it logged.
//
// Built by the faults tests (go build ./testdata/stockworker); not part of
// Troupe.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/proto/capv1"
)

func main() {
	url := flag.String("nats", "nats://127.0.0.1:4222", "NATS URL")
	id := flag.String("id", "", "worker id")
	pool := flag.String("pool", "default", "pool announced in heartbeats")
	topics := flag.String("topics", "job.echo", "comma-separated topics (pool subjects)")
	sleep := flag.Duration("sleep", time.Second, "how long each job runs")
	maxPar := flag.Int("max-parallel", 16, "max_parallel_jobs announced")
	beat := flag.Duration("heartbeat", 5*time.Second, "heartbeat interval (CAP SDKs: 5 s)")
	receipts := flag.String("receipts", "", "file that gets every job id received, a line each")
	flag.Parse()
	if *id == "" || *receipts == "" {
		fmt.Fprintln(os.Stderr, "stockworker: --id and --receipts are required")
		os.Exit(2)
	}
	f, err := os.OpenFile(*receipts, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stockworker:", err)
		os.Exit(1)
	}
	nc, err := nats.Connect(*url, nats.Name("stockworker "+*id), nats.MaxReconnects(-1))
	if err != nil {
		fmt.Fprintln(os.Stderr, "stockworker:", err)
		os.Exit(1)
	}
	subj := bus.NewSubjects("")
	var active atomic.Int32
	var mu sync.Mutex
	caps := strings.Split(*topics, ",")
	heartbeat := func() {
		data, err := bus.EncodeHeartbeat(*id, &capv1.Heartbeat{WorkerId: *id, Pool: *pool, Type: "stock-cap",
			ActiveJobs: active.Load(), MaxParallelJobs: int32(*maxPar), Capabilities: caps})
		if err == nil {
			_ = nc.Publish(subj.Heartbeat, data)
		}
	}
	onJob := func(m *nats.Msg) {
		pkt, err := bus.Decode(m.Data)
		req := pkt.GetJobRequest()
		if err != nil || req == nil {
			return
		}
		mu.Lock()
		_, _ = f.WriteString(req.JobId + "\n")
		mu.Unlock()
		active.Add(1)
		go func() {
			start := time.Now()
			time.Sleep(*sleep)
			active.Add(-1)
			data, err := bus.EncodeResult(pkt.TraceId, *id, &capv1.JobResult{JobId: req.JobId,
				Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: req.ContextPtr, WorkerId: *id,
				ExecutionMs: time.Since(start).Milliseconds()})
			if err == nil {
				_ = nc.Publish(subj.Result, data)
			}
		}()
	}
	for _, t := range caps {
		s, err := nc.QueueSubscribe(subj.Pool(t), subj.Pool(t), onJob)
		if err != nil {
			fmt.Fprintln(os.Stderr, "stockworker:", err)
			os.Exit(1)
		}
		_ = s.SetPendingLimits(-1, -1)
	}
	if err := nc.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "stockworker:", err)
		os.Exit(1)
	}
	heartbeat()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(*beat)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			nc.Close()
			return
		case <-tick.C:
			heartbeat()
		}
	}
}
