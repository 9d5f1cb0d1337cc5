package troupe_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/embedded"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// Example embeds a node in a Go program: in-process NATS and Redis-protocol
// servers, one node with the default routing (job.echo and job.sleep to
// pool "default"), one CAP worker, one job.
func Example() {
	ns, _ := embedded.StartNATS()
	defer ns.Stop()
	rs, _ := embedded.StartRedis()
	defer rs.Stop()

	node, err := troupe.NewNode(troupe.Config{
		NATSURL: ns.URL(), RedisURL: rs.URL(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := node.Start(ctx); err != nil {
		panic(err)
	}
	defer node.Stop(ctx)

	nc, _ := nats.Connect(ns.URL())
	defer nc.Close()
	w, _ := worker.Start(nc, worker.Config{ID: "w1", Pool: "default", Topics: []string{"job.echo"},
		Direct: true, Handler: worker.Echo})
	defer w.Stop()
	if err := node.WaitForWorkers(ctx, "default", 1); err != nil {
		panic(err)
	}

	_ = node.Submit(ctx, &capv1.JobRequest{JobId: "hello-1", Topic: "job.echo"})
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if rec, err := node.Wait(wctx, "hello-1"); err == nil {
		fmt.Println(rec.State, len(rec.History), "transitions")
	}
	// Output: SUCCEEDED 5 transitions
}

// ExampleDefaultPools routes a topic of one's own, given as Go values,
// beside the default ones: job.summarize to pool "llm", whose workers must
// announce the capability "gpu".
func ExampleDefaultPools() {
	ns, _ := embedded.StartNATS()
	defer ns.Stop()
	rs, _ := embedded.StartRedis()
	defer rs.Stop()

	pools := troupe.DefaultPools()
	pools.Topics["job.summarize"] = []string{"llm"}
	pools.Pools["llm"] = troupe.Pool{Requires: []string{"gpu"}}
	node, err := troupe.NewNode(troupe.Config{NATSURL: ns.URL(), RedisURL: rs.URL(), Pools: pools,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := node.Start(ctx); err != nil {
		panic(err)
	}
	defer node.Stop(ctx)
	fmt.Println(node.PoolConfig().Topics["job.summarize"], node.PoolConfig().Topics["job.echo"])
	// Output: [llm] [default]
}

// ExampleClient hands a job to a node from a program that runs no
// scheduler of its own: the client publishes the submit and reads the
// job's record.
func ExampleClient() {
	ns, _ := embedded.StartNATS()
	defer ns.Stop()
	rs, _ := embedded.StartRedis()
	defer rs.Stop()
	ctx := context.Background()
	node, err := troupe.NewNode(troupe.Config{NATSURL: ns.URL(), RedisURL: rs.URL(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	if err := node.Start(ctx); err != nil {
		panic(err)
	}
	defer node.Stop(ctx)
	nc, _ := nats.Connect(ns.URL())
	defer nc.Close()
	w, _ := worker.Start(nc, worker.Config{ID: "w1", Pool: troupe.PoolDefault, Topics: []string{"job.echo"},
		Direct: true, Handler: worker.Echo})
	defer w.Stop()
	_ = node.WaitForWorkers(ctx, troupe.PoolDefault, 1)

	c, err := troupe.NewClient(ctx, troupe.ClientConfig{NATSURL: ns.URL(), RedisURL: rs.URL()})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	_ = c.Submit(ctx, &capv1.JobRequest{JobId: "hello-2", Topic: "job.echo"})
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if rec, err := c.Wait(wctx, "hello-2"); err == nil {
		fmt.Println(rec.State)
	}
	// Output: SUCCEEDED
}
