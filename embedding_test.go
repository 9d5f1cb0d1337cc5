package troupe_test

import (
	"context"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// A node given no Pools and no PoolsFile routes as the CLI does
// (DefaultPools): a worker of pool "default" runs job.echo and job.sleep.
func TestNewNodeWithoutPoolsRoutesAsTheCLI(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	node, err := troupe.NewNode(troupe.Config{NATSURL: env.NATSURL, RedisURL: env.RedisURL,
		KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(), Logger: quietLogger()})
	if err != nil {
		t.Fatalf("NewNode without pools: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	w, err := worker.Start(env.NATS, worker.Config{ID: "w1", Pool: troupe.PoolDefault, Topics: []string{"job.echo"},
		Direct: true, SubjectPrefix: env.Prefix, Handler: worker.Echo, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	if err := node.WaitForWorkers(ctx, troupe.PoolDefault, 1); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"job.echo", "job.sleep"} {
		id := "default-routing-" + topic
		if err := node.Submit(ctx, &capv1.JobRequest{JobId: id, Topic: topic}); err != nil {
			t.Fatal(err)
		}
		rec, err := node.Wait(ctx, id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if rec.State != troupe.StateSucceeded {
			t.Fatalf("%s ended %s (%s), want SUCCEEDED", id, rec.State, rec.Reason)
		}
	}
}
