package troupe_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// commandCalls sums the calls of every command in INFO commandstats
// (commands run inside scripts included, as Redis counts them).
func commandCalls(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(line, ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		v, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}
		n += v
	}
	return n
}

// waitDueIdle waits (up to 10 s) until the node's due poller has backed off
// to its idle interval.
func waitDueIdle(t *testing.T, node *troupe.Node, idle time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); node.DueInterval() != idle; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("due poller interval %v after 10 s idle, want %v", node.DueInterval(), idle)
		}
	}
}

// An idle node's Redis commands per second stay under what its idle poll
// intervals allow, counted by a private redis-server's INFO commandstats:
// per idle interval the due poller's three scripts over the 64 shards (with
// the four reads they make), the saga trigger poller's 64 reads at its idle
// interval, and a few dozen lock, lease and schedule commands. Polling at
// the busy interval would cost four times as many.
func TestIdleNodeRedisCommandsStayUnderABound(t *testing.T) {
	t.Parallel()
	addr := startRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	const poll, idle = 100 * time.Millisecond, 400 * time.Millisecond
	f := newFixtureIn(t, testenv.New(t), func(c *troupe.Config) {
		c.RedisURL = "redis://" + addr
		c.Tuning.DuePoll, c.Tuning.DueIdlePoll, c.Tuning.SagaPoll = poll, idle, poll
	})
	waitDueIdle(t, f.node, idle)
	const window = 2 * time.Second
	before, start := commandCalls(t, rdb), time.Now()
	time.Sleep(window) // the quantity measured is a rate over time
	perSec := float64(commandCalls(t, rdb)-before) / time.Since(start).Seconds()
	perIdle := 7*store.Shards + store.Shards + 64 // due poller, saga poller, the rest
	bound := float64(perIdle) / idle.Seconds()
	busy := float64(perIdle) / poll.Seconds()
	t.Logf("idle node: %.0f Redis commands/s (bound %.0f; at the busy interval ~%.0f)", perSec, bound, busy)
	if perSec > bound {
		t.Fatalf("an idle node made %.0f Redis commands/s, want at most %.0f (its pollers at their %v idle interval)", perSec, bound, idle)
	}
}

// A human decision written by another replica (its store, with no poke of
// this node's poller) makes the job due now; this node's due poller, backed
// off to its idle interval, still wakes it within DueSlack + DueIdlePoll.
func TestIdleNodeWakesAnApprovalDecidedOnAnotherReplica(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	const poll, idle, slack = 50 * time.Millisecond, time.Second, 100 * time.Millisecond
	f := newFixtureIn(t, env, func(c *troupe.Config) {
		c.Policy = labelPolicy{}
		c.Tuning.DuePoll, c.Tuning.DueIdlePoll, c.Tuning.DueSlack = poll, idle, slack
	})
	ctx := context.Background()
	other := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	if err := other.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	req := echoReq("job-idle-approve")
	req.Labels = map[string]string{"cordum.policy": "approve"}
	f.submit(req)
	r := f.waitState(req.JobId, jobstate.StateApprovalRequired)
	waitDueIdle(t, f.node, idle)
	decided := time.Now()
	if err := other.Decide(ctx, req.JobId, store.DecisionApproved, "bob", "fine", r.Fields["job_hash"]); err != nil {
		t.Fatal(err)
	}
	// The promise is DueSlack + DueIdlePoll; a second more for a tick's
	// own time and the activation on a loaded machine.
	bound := slack + idle + time.Second
	for {
		r, err := f.node.Record(ctx, req.JobId)
		if err == nil && r.State != jobstate.StateApprovalRequired {
			t.Logf("approval taken %v after the decision (%s)", time.Since(decided), r.State)
			return
		}
		if time.Since(decided) > bound {
			t.Fatalf("job not woken %v after another replica's decision (read: %v), want within %v", time.Since(decided), err, bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
