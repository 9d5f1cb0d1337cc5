package troupe_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/embedded"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// Sum and Total are a job's input and result types for the typed worker.
type Sum struct{ Numbers []int }
type Total struct{ Total int }

// ExampleClient_SubmitPayload hands a job its input and reads its result:
// a worker with typed arguments (worker.Typed) decodes the input, and its
// answer is stored as the job's result, where CAP's Redis convention
// keeps both.
func ExampleClient_SubmitPayload() {
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

	// The worker: typed arguments, its data in the same Redis.
	rdb := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(rs.URL(), "redis://")})
	defer rdb.Close()
	sum := worker.Typed(rdb, 0, func(_ context.Context, in Sum) (Total, error) {
		t := 0
		for _, n := range in.Numbers {
			t += n
		}
		return Total{Total: t}, nil
	})
	nc, _ := nats.Connect(ns.URL())
	defer nc.Close()
	w, _ := worker.Start(nc, worker.Config{ID: "w1", Pool: troupe.PoolDefault, Topics: []string{"job.echo"},
		Direct: true, Handler: sum})
	defer w.Stop()
	_ = node.WaitForWorkers(ctx, troupe.PoolDefault, 1)

	c, err := troupe.NewClient(ctx, troupe.ClientConfig{NATSURL: ns.URL(), RedisURL: rs.URL()})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	if err := c.SubmitPayload(ctx, &capv1.JobRequest{JobId: "sum-1", Topic: "job.echo"}, []byte(`{"Numbers": [1, 2, 3]}`)); err != nil {
		panic(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.Wait(wctx, "sum-1"); err != nil {
		panic(err)
	}
	res, err := c.Result(ctx, "sum-1")
	fmt.Println(string(res), err)
	// Output: {"Total":6} <nil>
}

// ExampleClient_Watch follows a job's states as it goes through them.
func ExampleClient_Watch() {
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
		Direct: true, Handler: worker.Demo(worker.Echo)})
	defer w.Stop()
	_ = node.WaitForWorkers(ctx, troupe.PoolDefault, 1)

	c, err := troupe.NewClient(ctx, troupe.ClientConfig{NATSURL: ns.URL(), RedisURL: rs.URL()})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The demo worker fails a job whose env asks it to.
	_ = c.Submit(ctx, &capv1.JobRequest{JobId: "watched-1", Topic: "job.echo", Env: map[string]string{"demo.fail": "1"}})
	for ev := range c.Watch(wctx, "watched-1") {
		fmt.Println(ev.State, ev.Reason)
		if ev.Record != nil {
			fmt.Println("error:", ev.Record.ErrorMessage)
		}
	}
	// Output:
	// PENDING submitted
	// SCHEDULED policy_allowed
	// DISPATCHED dispatched
	// FAILED worker_failed
	// error: demo failure
}
