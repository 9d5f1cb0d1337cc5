package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/bus"
	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/embedded"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/store"
	"github.com/troupe-run/troupe/worker"
)

func runDev(ctx context.Context, args []string) error {
	fs := newFlags("dev")
	var c common
	c.register(fs, false, false)
	jobs := fs.Int("jobs", 5, "demo jobs to submit")
	exit := fs.Bool("exit", false, "exit after the demo jobs finish instead of serving until interrupted")
	poolsFile := fs.String("pools", "", "pools.yaml (default: the built-in demo routing)")
	var af adminFlags
	af.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if c.logLevel == "info" {
		c.logLevel = "warn" // the demo prints job paths; keep the log quiet
	}
	log := c.logger()

	fmt.Println("troupe dev: starting embedded NATS (JetStream) and an embedded Redis-protocol store…")
	ns, err := embedded.StartNATS()
	if err != nil {
		return err
	}
	defer ns.Stop()
	rs, err := embedded.StartRedis()
	if err != nil {
		return err
	}
	defer rs.Stop()

	pools, err := loadPools(*poolsFile)
	if err != nil {
		return err
	}
	node, err := troupe.NewNode(troupe.Config{NodeID: "dev-node", NATSURL: ns.URL(), RedisURL: rs.URL(),
		Pools: pools, Policy: safety.AllowAll{}, Logger: log})
	if err != nil {
		return err
	}
	if err := node.Start(ctx); err != nil {
		return err
	}
	defer node.Stop(context.Background())
	if stopAdmin, err := af.start(node, log); err != nil {
		// The demo does not need the dashboard (the port may be taken).
		fmt.Printf("dashboard not started: %v\n", err)
	} else {
		defer stopAdmin()
		if af.listen != "" {
			fmt.Printf("dashboard http://%s/ui  metrics http://%s/metrics\n", af.listen, af.listen)
		}
	}

	nc, err := nats.Connect(ns.URL(), nats.Name("troupe-dev"))
	if err != nil {
		return err
	}
	defer nc.Close()
	subj := node.Subjects()
	// Two workers that take direct dispatch and dedupe (so lost dispatches
	// are repeated to them) and one stock CAP worker that only listens on
	// its pool subject.
	for i, direct := range []bool{true, true, false} {
		w, err := worker.Start(nc, worker.Config{ID: worker.Name("default", i+1), Pool: "default",
			Topics: []string{"job.echo", "job.sleep"}, Direct: direct, Subjects: subj,
			Handler: demoHandler, Progress: true, Dedupe: direct})
		if err != nil {
			return err
		}
		defer w.Stop()
	}
	fmt.Printf("nats %s  redis %s  node %s  workers default-w1, default-w2 (direct), default-w3 (pool subject)\n\n",
		ns.URL(), rs.URL(), node.ID())
	waitWorkers(ctx, node, 3)

	ids := make([]string, 0, *jobs)
	for i := 0; i < *jobs; i++ {
		topic := "job.echo"
		if i%2 == 1 {
			topic = "job.sleep"
		}
		id := fmt.Sprintf("demo-%d-%s", i+1, newID("")[:6])
		ids = append(ids, id)
		req := &capv1.JobRequest{JobId: id, Topic: topic, ContextPtr: "redis://ctx:" + id, TenantId: "demo"}
		data, err := bus.EncodeRequest(id, "troupe-dev", req)
		if err != nil {
			return err
		}
		if err := nc.Publish(subj.Submit, data); err != nil {
			return err
		}
	}
	ok := 0
	for _, id := range ids {
		rec, err := waitTerminal(ctx, node.Store(), id, 30*time.Second)
		if err != nil {
			return err
		}
		printJob(os.Stdout, rec)
		fmt.Println()
		if rec.State == core.StateSucceeded {
			ok++
		}
	}
	fmt.Printf("%d of %d demo jobs SUCCEEDED\n", ok, len(ids))
	if ok != len(ids) {
		return fmt.Errorf("%d demo jobs did not succeed", len(ids)-ok)
	}
	if *exit {
		return nil
	}
	fmt.Printf("\nThe node keeps running. Try, in another shell:\n"+
		"  go run ./cmd/troupe submit --nats %s --topic job.echo --wait --redis %s\n"+
		"Press Ctrl-C to stop.\n", ns.URL(), rs.URL())
	<-ctx.Done()
	return nil
}

func demoHandler(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
	if req.Topic == "job.sleep" {
		return worker.Sleep(50*time.Millisecond)(ctx, req)
	}
	return worker.Echo(ctx, req)
}

func waitWorkers(ctx context.Context, node *troupe.Node, n int) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if ws, err := node.Workers(); err == nil && len(ws) >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitTerminal polls a job until it is terminal or timeout passes.
func waitTerminal(ctx context.Context, st *store.Store, id string, timeout time.Duration) (*store.JobRecord, error) {
	deadline := time.Now().Add(timeout)
	for {
		rec, err := st.GetJob(ctx, id)
		if err == nil && rec.State.Terminal() {
			return rec, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return nil, fmt.Errorf("job %s: %w", id, err)
			}
			return rec, fmt.Errorf("job %s still %s after %s", id, rec.State, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
