package store_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// privateRedis starts a redis-server of the test's own (no persistence) and
// returns a client of it; the test is skipped when redis-server is not
// installed. Its command counters see only this test's commands.
func privateRedis(t *testing.T) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed")
	}
	// A free port may be taken by another process before the server binds
	// it (tests run side by side): try fresh ports, a few times.
	for attempt := 1; attempt <= 5; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		_ = l.Close()
		cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", t.TempDir())
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + port})
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if c.Ping(context.Background()).Err() == nil {
				t.Cleanup(func() {
					_ = c.Close()
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
				})
				return c
			}
		}
		_ = c.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	t.Fatal("redis-server never answered on a free port in 5 attempts")
	return nil
}

// commandCalls returns INFO commandstats' calls per command ("hset": 3),
// the commands scripts run included.
func commandCalls(t *testing.T, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		// cmdstat_hset:calls=3,usec=...
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				out[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return out
}

// TestHappyPathServerCommandsPerJob runs jobs through the happy path's two
// scripts (create straight into DISPATCHED with the lock kept; RUNNING and
// SUCCEEDED in one transition) on a private redis-server and counts the
// commands the server runs per job: the scripts' EVALSHA and the commands
// inside them. It fails when the count grows past what the scripts do now
// (issues #18, #33: Redis cost per job). 14: the create reads the job's
// record, lock and cancel mark (lua/cancel_mark.lua) with one EXISTS of the
// three, which finds none on the happy path; the terminal write sets no
// expiry (the retention trim deletes the record later, off the hot path);
// the job's lease is a member of its shard's due set, written with the due
// entry in one ZADD and dropped with it in one ZREM (Keys.LeaseMember).
func TestHappyPathServerCommandsPerJob(t *testing.T) {
	t.Parallel()
	rdb := privateRedis(t)
	ctx := context.Background()
	s := store.New(rdb, store.Config{Prefix: "cost:", LockTTL: 10 * time.Second})
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	w := s.NewWriter(1, 64, 1024)
	t.Cleanup(w.Close)
	b := &bundle{s: s, w: w}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const jobs = 20
	for i := 0; i < jobs; i++ {
		id := "cost-" + strconv.Itoa(i)
		r := b.do(t, &store.Op{Kind: store.OpActivate, JobID: id, Node: "n", Create: true, Topic: "job.x",
			Tenant: "t", TraceID: "tr", Request: []byte("req"),
			T: &store.Transition{Path: []store.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonAllowed},
				{To: jobstate.StateDispatched, Reason: jobstate.ReasonDispatched}},
				Due: time.Now().Add(time.Minute).UnixMilli(), Fields: []string{"worker", "w1", "subj", "cap.w1"}}})
		if r.Status != store.ActivateCreated || r.State != jobstate.StateDispatched {
			t.Fatalf("activate %s: %+v", id, r)
		}
		r = b.do(t, &store.Op{Kind: store.OpTransition, JobID: id, Node: "n", LockValue: jobstate.LockValue("n", 1),
			T: &store.Transition{Expect: jobstate.Expect(jobstate.StateDispatched),
				Path: []store.Hop{{To: jobstate.StateRunning, Reason: jobstate.ReasonStarted},
					{To: jobstate.StateSucceeded, Reason: jobstate.ReasonCompleted}},
				Fields: []string{"result_ptr", "p"}}})
		if r.Step != store.StepOK {
			t.Fatalf("finish %s: %+v", id, r)
		}
	}
	calls := commandCalls(t, rdb)
	var total int64
	var parts []string
	for name, n := range calls {
		switch name {
		case "info", "config|resetstat", "config", "ping", "hello", "client|setinfo", "client", "script|load", "script":
			continue
		}
		total += n
		parts = append(parts, fmt.Sprintf("%s %.1f", name, float64(n)/jobs))
	}
	sort.Strings(parts)
	perJob := float64(total) / jobs
	t.Logf("server commands per job: %.1f (%s)", perJob, strings.Join(parts, ", "))
	if perJob > 14 {
		t.Errorf("the happy path costs %.1f server commands per job, want at most 14", perJob)
	}
}
