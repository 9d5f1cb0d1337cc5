package troupe_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// adminNode builds a node for the operators' methods (node_admin.go); it is
// not started. mutate, when given, adjusts its config.
func adminNode(t *testing.T, mutate ...func(*troupe.Config)) (*troupe.Node, *testenv.Env) {
	t.Helper()
	env := testenv.New(t)
	pools, err := troupe.ParsePools([]byte("topics:\n  job.echo: echo\npools:\n  echo: {requires: []}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := troupe.Config{NodeID: "node-adm", NATSURL: env.NATSURL, RedisURL: env.RedisURL,
		KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(), Pools: pools,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, m := range mutate {
		m(&cfg)
	}
	node, err := troupe.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return node, env
}

func TestReadyNamesEveryCheckThatFails(t *testing.T) {
	t.Parallel()
	// The node does not recreate the stream this test deletes
	// (TestFaultStreamDeletedWhileRunning shows it does by default).
	node, env := adminNode(t, func(c *troupe.Config) { c.Tuning.StreamCheck = -1 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := node.Ready(ctx); !errors.Is(err, troupe.ErrNotStarted) {
		t.Fatalf("before Start: %v, want ErrNotStarted", err)
	}
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := node.Ready(ctx); err != nil {
		t.Fatalf("started node not ready: %v", err)
	}
	failedChecks := func() map[string]string {
		t.Helper()
		rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer rcancel()
		var nr *troupe.NotReadyError
		if err := node.Ready(rctx); !errors.As(err, &nr) {
			t.Fatalf("Ready: %v, want a NotReadyError", err)
		}
		return nr.FailedChecks()
	}
	// A stream deleted under the node: only that check fails.
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, bus.StreamName(env.StreamPrefix(), bus.StreamCancel)); err != nil {
		t.Fatal(err)
	}
	if f := failedChecks(); len(f) != 1 || f[troupe.ReadyStreams] == "" {
		t.Fatalf("with a stream missing: %v, want streams only", f)
	}
	// Stopped, the node has closed its connections and its actors: each
	// check fails with its own reason.
	if err := node.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	f := failedChecks()
	for _, name := range []string{troupe.ReadyNATS, troupe.ReadyRedis, troupe.ReadyRegistry} {
		if f[name] == "" {
			t.Errorf("check %s passed on a stopped node (failed: %v)", name, f)
		}
	}
}

func TestRetryDLQRefusesWhatCannotRunAgain(t *testing.T) {
	t.Parallel()
	node, _ := adminNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	st := node.Store()
	// An input that never became a job, and a job whose record is gone.
	for _, e := range []*store.DLQEntry{
		{Reason: jobstate.ReasonDecodeFailed, Raw: []byte{0xff}},
		{JobID: "expired-job", Reason: jobstate.ReasonTopicUnmapped},
	} {
		if err := st.AddDLQ(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	es, err := node.ListDLQ(ctx, 10)
	if err != nil || len(es) != 2 {
		t.Fatalf("dlq %v %v", es, err)
	}
	for _, e := range es {
		if _, err := node.RetryDLQ(ctx, e.ID, false); !errors.Is(err, store.ErrNotRetryable) {
			t.Errorf("retry of %+v: %v, want ErrNotRetryable", e, err)
		}
		// A refused retry leaves no mark: nothing was submitted.
		if m, _ := node.DLQRetried(ctx, []string{e.ID}); len(m) != 0 {
			t.Errorf("refused retry left a mark: %v", m)
		}
	}
	if _, err := node.RetryDLQ(ctx, "1-1", false); !errors.Is(err, store.ErrDLQNotFound) {
		t.Errorf("retry of an unknown entry: %v", err)
	}
	// The listing and the counts work on an empty cluster too.
	if p, err := node.ListJobs(ctx, store.ListQuery{State: jobstate.StateRunning}); err != nil || len(p.Jobs) != 0 {
		t.Errorf("list: %+v %v", p, err)
	}
	if c, err := node.CountStates(ctx); err != nil || len(c) != len(jobstate.AllStates) {
		t.Errorf("counts: %v %v", c, err)
	}
	if topics := node.PoolConfig().TopicNames(); !slices.Equal(topics, []string{"job.echo"}) {
		t.Errorf("pool config topics %v", topics)
	}
}
