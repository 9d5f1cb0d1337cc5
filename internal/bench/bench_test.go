package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
)

// smokeConfig is a seconds-long run against the test servers: what CI runs.
// It asserts correctness only; timing depends on the machine.
func smokeConfig(t *testing.T, env *testenv.Env, target Target) Config {
	return Config{
		Target: target, Jobs: 300, Workers: 3, Warmup: 20, Node: NodeInProcess,
		RedisURL: env.RedisURL, NATSURL: env.NATSURL, RunID: env.Prefix + string(target[0]),
		Timeout: 60 * time.Second,
		Log:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// TestBenchSmoke runs the harness end to end against an in-process node: every
// job must end SUCCEEDED, no worker may receive a job twice, and the run must
// leave no keys or streams behind.
func TestBenchSmoke(t *testing.T) {
	t.Parallel()
	for _, target := range []Target{TargetTroupe, TargetFloor} {
		t.Run(string(target), func(t *testing.T) {
			t.Parallel()
			env := testenv.New(t)
			cfg := smokeConfig(t, env, target)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			res, err := Run(ctx, cfg)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			j := res.Jobs
			if !res.OK || j.Succeeded != cfg.Jobs || j.NotTerminal != 0 || j.Duplicates != 0 || j.NeverReceived != 0 {
				t.Fatalf("want %d SUCCEEDED exactly once; got %+v (failures %v)", cfg.Jobs, j, res.Failures)
			}
			if res.DispatchMs.Count != cfg.Jobs || res.SubmitToTerminalMs.Count != cfg.Jobs {
				t.Errorf("latencies for %d and %d jobs, want %d each", res.DispatchMs.Count, res.SubmitToTerminalMs.Count, cfg.Jobs)
			}
			if !res.Redis.ClientMeasured || res.Redis.RoundTripsPerJob <= 0 {
				t.Errorf("node round trips not counted: %+v", res.Redis)
			}
			// The workers state the default limit and count what they held;
			// only a node reports capacity waits.
			if res.Params.MaxParallel != MaxParallelDefault || res.MaxHeld < 1 {
				t.Errorf("max_parallel %d, max_held %d; want %d and ≥ 1", res.Params.MaxParallel, res.MaxHeld, MaxParallelDefault)
			}
			if (res.CapacityWaitsPerJob != nil) != (target == TargetTroupe) {
				t.Errorf("capacity_waits_per_job %v for target %s", res.CapacityWaitsPerJob, target)
			}
			var sum strings.Builder
			FormatReport(&sum, res)
			t.Log("\n" + sum.String())

			// The run cleaned up after itself.
			pfx := PrefixesFor(cfg.RunID)
			keys, err := env.Redis.Keys(ctx, pfx.Key+"*").Result()
			if err != nil || len(keys) != 0 {
				t.Errorf("keys left behind: %d (%v)", len(keys), err)
			}
			js, _ := jetstream.New(env.NATS)
			if _, err := js.Stream(ctx, bus.StreamName(pfx.Stream, bus.StreamSubmit)); err == nil {
				t.Errorf("stream %s left behind", bus.StreamName(pfx.Stream, bus.StreamSubmit))
			}

			// The outputs are written and readable.
			dir := t.TempDir()
			if err := WriteOutputs(res, dir); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(res.Files.JSON)
			if err != nil {
				t.Fatal(err)
			}
			var back Result
			if err := json.Unmarshal(b, &back); err != nil || back.RunID != res.RunID ||
				len(back.DispatchHist.Counts) == 0 || back.Jobs.Succeeded != cfg.Jobs {
				t.Errorf("JSON output: %v, run %q, %d dispatch buckets, %d succeeded",
					err, back.RunID, len(back.DispatchHist.Counts), back.Jobs.Succeeded)
			}
		})
	}
}

// TestExternalNeedsItsNode: with no node running on the run's prefixes, an
// external run fails at once with the command that starts one, rather than
// waiting for jobs nobody schedules.
func TestExternalNeedsItsNode(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	_, err := Run(context.Background(), Config{Node: NodeExternal, RunID: env.Prefix + "x",
		RedisURL: env.RedisURL, NATSURL: env.NATSURL, Jobs: 10})
	if err == nil || !strings.Contains(err.Error(), "troupe node --key-prefix") {
		t.Fatalf("want an error naming the node command, got %v", err)
	}
	if _, err := Run(context.Background(), Config{Node: NodeExternal}); err == nil {
		t.Fatal("external without a run id must be refused")
	}
}

// TestChildProtocol drives ServeChild over pipes, as the bench drives the
// child process: start a node, read its workers and counters, stop it.
func TestChildProtocol(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pfx := PrefixesFor(env.Prefix + "c")
	t.Cleanup(func() {
		js, _ := jetstream.New(env.NATS)
		for _, k := range []bus.StreamKind{bus.StreamSubmit, bus.StreamResult, bus.StreamCancel} {
			_ = js.DeleteStream(context.Background(), bus.StreamName(pfx.Stream, k))
		}
		if keys, _ := env.Redis.Keys(context.Background(), pfx.Key+"*").Result(); len(keys) > 0 {
			env.Redis.Del(context.Background(), keys...)
		}
	})
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := ServeChild(ctx, inR, outW, io.Discard)
		_ = outW.Close()
		done <- err
	}()
	ct, err := connectChild(inW, outR, done, sutSpec{Role: TargetTroupe, RedisURL: env.RedisURL, NATSURL: env.NATSURL,
		KeyPrefix: pfx.Key, SubjectPrefix: pfx.Subject, StreamPrefix: pfx.Stream, Topic: TopicDefault,
		Pool: PoolDefault, NodeID: "child-test"})
	if err != nil {
		t.Fatal(err)
	}
	if ct.pid() != os.Getpid() {
		t.Errorf("child reported pid %d, want %d (same process here)", ct.pid(), os.Getpid())
	}
	if n, err := ct.workers(ctx); err != nil || n != 0 {
		t.Errorf("workers = %d, %v; want 0 (none started)", n, err)
	}
	sn, has, err := ct.snap(ctx)
	if err != nil || !has.CPU || sn.CPU <= 0 || sn.PeakRSS <= 0 || sn.Redis.Commands == 0 {
		t.Errorf("snap = %+v, %+v, %v; want CPU, RSS and the node's Redis commands", sn, has, err)
	}
	if sn.CapacityWaits == nil {
		t.Error("snap has no capacity waits: the child's node must report them in its reply")
	}
	if err := ct.stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := ct.call(childCmd{Cmd: "snap"}); err == nil {
		t.Error("a stopped child still answers")
	}
}

func TestRedisCounterCountsRoundTrips(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	rdb, rc, err := newCountedClient(env.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	key := env.KeyPrefix() + "counter"
	// A connection's handshake (HELLO, CLIENT SETINFO) goes through the hook
	// too, and go-redis keeps pipelines on a pool of their own: open a
	// connection of each kind before counting.
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error { return p.Ping(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	before := rc.snapshot()
	rdb.Set(ctx, key, "1", time.Minute)
	pipe := rdb.Pipeline()
	pipe.Incr(ctx, key)
	pipe.Incr(ctx, key)
	pipe.Get(ctx, key)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	d := rc.snapshot().sub(before)
	if d.Commands != 4 || d.RoundTrips != 2 || d.ByName["incr"] != 2 {
		t.Fatalf("want 4 commands in 2 round trips (2 incr), got %+v", d)
	}
}

func TestParseInfo(t *testing.T) {
	t.Parallel()
	var st serverStats
	st.calls = map[string]int64{}
	parseInfo("# Server\r\nredis_version:7.0.15\r\n# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:0.5\r\n"+
		"# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.50\r\ncmdstat_hset:calls=7,usec=1\r\n", &st)
	if st.version != "7.0.15" || st.cpuSec != 2 || st.calls["evalsha"] != 12 || st.calls["hset"] != 7 {
		t.Fatalf("parsed %+v", st)
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	ms := make([]float64, 0, 1000)
	for i := 1000; i >= 1; i-- {
		ms = append(ms, float64(i))
	}
	p := summarize(ms)
	if p.P50 != 500 || p.P90 != 900 || p.P99 != 990 || p.P999 != 999 || p.Max != 1000 || p.Count != 1000 || p.Mean != 500.5 {
		t.Fatalf("nearest-rank percentiles of 1..1000: %+v", p)
	}
	if (summarize(nil) != Percentiles{}) {
		t.Fatal("empty input must give zero percentiles")
	}
}

func TestTrackerCountsDuplicatesAndForeignIDs(t *testing.T) {
	t.Parallel()
	tr := newTracker("r1-", "r1w-", 3)
	tr.markReceived("r1-0", 5)
	tr.markReceived("r1-0", 9)
	tr.markReceived("r1-1", 7)
	tr.markReceived("r1w-0", 7)
	tr.markReceived("other-1", 7)
	tr.markReceived("r1-3", 7) // out of range
	dup, never := tr.duplicates()
	if dup != 1 || never != 1 || tr.received.Load() != 2 || tr.receiptNs[0].Load() != 5 {
		t.Fatalf("dup %d never %d received %d first receipt %d", dup, never, tr.received.Load(), tr.receiptNs[0].Load())
	}
	if tr.warmSeen.Load() != 1 || tr.foreign.Load() != 2 {
		t.Fatalf("warm %d foreign %d", tr.warmSeen.Load(), tr.foreign.Load())
	}
}

func TestAppendRowsGoesAboveTheMarker(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "B.md")
	if err := os.WriteFile(path, []byte("# B\n\n"+RowHeader+"\n"+RunsMarker+"\n\n## after\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := &Result{Target: TargetTroupe, NodeMode: NodeChild, Params: Params{Jobs: 5, Workers: 1}, OK: true, JobsPerSec: 42}
	if err := AppendRows(path, Row(res, "a|b")); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	s := string(b)
	row := strings.Index(s, "| 42 |")
	if row < 0 || row > strings.Index(s, RunsMarker) || !strings.Contains(s, "a/b") {
		t.Fatalf("row not inserted above the marker (or a pipe not escaped):\n%s", s)
	}
	if got, want := strings.Count(Row(res, ""), "|"), strings.Count(strings.Split(RowHeader, "\n")[0], "|"); got != want {
		t.Fatalf("row has %d cell separators, header %d", got, want)
	}
	if err := AppendRows(filepath.Join(t.TempDir(), "none.md"), "x"); err == nil {
		t.Fatal("a missing file must be an error")
	}
}

func TestValidRunID(t *testing.T) {
	t.Parallel()
	for id, ok := range map[string]bool{"r1a2": true, "": false, "R1": false, "a.b": false, "a-b": false,
		strings.Repeat("a", maxRunIDLength+1): false} {
		if err := validRunID(id); (err == nil) != ok {
			t.Errorf("validRunID(%q) = %v", id, err)
		}
	}
}

// TestBenchHoldSmoke runs a hold run end to end: every job is in flight at
// once (with a worker, unanswered), parked by the node, then answered; every
// job must end SUCCEEDED exactly once.
func TestBenchHoldSmoke(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := smokeConfig(t, env, TargetTroupe)
	cfg.RunID = env.Prefix + "h"
	cfg.Hold, cfg.HoldFor, cfg.ParkAfter = true, time.Second, 100*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	h, j := res.Hold, res.Jobs
	if !res.OK || j.Succeeded != cfg.Jobs || j.Duplicates != 0 {
		t.Fatalf("want %d SUCCEEDED exactly once; got %+v (failures %v)", cfg.Jobs, j, res.Failures)
	}
	if h == nil || h.InFlight != cfg.Jobs || h.Parked != int64(cfg.Jobs) || h.LiveActors != 0 {
		t.Fatalf("hold figures %+v, want %d in flight, all parked, no live actor", h, cfg.Jobs)
	}
	if h.RSSBytes <= 0 || h.HeapBytes == 0 {
		t.Errorf("node memory not read: %+v", h)
	}
}

// TestBenchAdoptSmoke runs an adoption run with real processes: the node
// holding every job in flight is killed (SIGKILL); the second node must
// adopt all of them, and every job must still end SUCCEEDED exactly once.
func TestBenchAdoptSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the troupe-bench binary")
	}
	t.Parallel()
	env := testenv.New(t)
	bin := benchBinary(t)
	cfg := smokeConfig(t, env, TargetTroupe)
	cfg.RunID = env.Prefix + "a"
	cfg.Node, cfg.ChildCommand = NodeChild, []string{bin, ServeArg}
	cfg.Adopt, cfg.HoldFor, cfg.ParkAfter, cfg.LockTTL = true, time.Second, 100*time.Millisecond, 2*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	a := res.Hold.Adoption
	if a == nil || !a.Complete || a.ParkedAtK != int64(cfg.Jobs) {
		t.Fatalf("adoption %+v, want all %d parked jobs adopted", a, cfg.Jobs)
	}
	if j := res.Jobs; j.Succeeded != cfg.Jobs || j.Duplicates != 0 {
		t.Fatalf("want %d SUCCEEDED exactly once; got %+v", cfg.Jobs, j)
	}
}

// TestFleetCountsHeldJobs: a worker's held count, peak and overfills follow
// receipts and answers as the worker sees them.
func TestFleetCountsHeldJobs(t *testing.T) {
	t.Parallel()
	f := &fleet{maxPar: 2, active: make([]atomic.Int32, 2), peak: make([]atomic.Int32, 2)}
	for range 3 {
		f.take(0) // the third arrives with 2 held: an overfill
	}
	f.take(1)
	f.active[0].Add(-1)
	f.take(0) // 3 held again: another overfill, same peak
	if held, over := f.capacity(); held != 3 || over != 2 {
		t.Fatalf("max held %d, overfills %d; want 3 and 2", held, over)
	}
	f.resetCapacity()
	if held, over := f.capacity(); held != 3 || over != 0 {
		t.Fatalf("after reset: max held %d, overfills %d; want 3 (still held) and 0", held, over)
	}
	f.maxPar = 0
	f.take(0)
	if _, over := f.capacity(); over != 0 {
		t.Fatalf("no stated limit counted %d overfills", over)
	}
}

// TestMaxParallelDefaults: 64 unless asked otherwise; a hold run states no
// limit unless asked, and refuses one that cannot hold all its jobs.
func TestMaxParallelDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		hold    bool
		set     int
		want    int32
		wantErr bool
	}{
		{set: 0, want: MaxParallelDefault},
		{set: -1, want: 0},
		{set: 8, want: 8},
		{hold: true, set: 0, want: 0},
		{hold: true, set: 1000, want: 1000},
		{hold: true, set: 8, wantErr: true}, // 10 workers × 8 < 100 jobs
	} {
		c := Config{Jobs: 100, Workers: 10, Hold: tc.hold, MaxParallel: tc.set}
		err := c.withDefaults()
		if (err != nil) != tc.wantErr || (err == nil && c.announcedMaxParallel() != tc.want) {
			t.Errorf("hold %v, max-parallel %d: got %d, %v; want %d (error %v)",
				tc.hold, tc.set, c.announcedMaxParallel(), err, tc.want, tc.wantErr)
		}
	}
}

// benchBinary builds the troupe-bench binary once for the tests that run
// the node in child processes.
func benchBinary(t *testing.T) string {
	t.Helper()
	benchBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "troupe-bench-test-")
		if err != nil {
			benchBuild.err = err
			return
		}
		benchBuild.path = filepath.Join(dir, "troupe-bench")
		if out, err := exec.Command("go", "build", "-o", benchBuild.path, "github.com/troupe-run/troupe/cmd/troupe-bench").CombinedOutput(); err != nil {
			benchBuild.err = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if benchBuild.err != nil {
		t.Fatal(benchBuild.err)
	}
	return benchBuild.path
}

var benchBuild struct {
	once sync.Once
	path string
	err  error
}

// TestMain removes the troupe-bench binary the tests built, if any.
func TestMain(m *testing.M) {
	code := m.Run()
	if benchBuild.path != "" {
		_ = os.RemoveAll(filepath.Dir(benchBuild.path))
	}
	os.Exit(code)
}

// TestBenchNodesSmoke runs two nodes on one run's prefixes, inside the bench
// and as child processes: every job must end SUCCEEDED exactly once, each job
// be created by exactly one node, and the report carry each node's figures
// and the forwarding between them (few: results reach their owner).
func TestBenchNodesSmoke(t *testing.T) {
	t.Parallel()
	for _, mode := range []NodeMode{NodeInProcess, NodeChild} {
		t.Run(string(mode), func(t *testing.T) {
			if mode == NodeChild && testing.Short() {
				t.Skip("builds the troupe-bench binary")
			}
			t.Parallel()
			env := testenv.New(t)
			cfg := smokeConfig(t, env, TargetTroupe)
			cfg.RunID = env.Prefix + "n" + string(mode[0])
			cfg.Nodes, cfg.Node = 2, mode
			if mode == NodeChild {
				cfg.ChildCommand = []string{benchBinary(t), ServeArg}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res, err := Run(ctx, cfg)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			var sum strings.Builder
			FormatReport(&sum, res)
			t.Log("\n" + sum.String())
			if j := res.Jobs; !res.OK || j.Succeeded != cfg.Jobs || j.Duplicates != 0 {
				t.Fatalf("want %d SUCCEEDED exactly once; got %+v (failures %v)", cfg.Jobs, j, res.Failures)
			}
			if res.Params.Nodes != 2 || len(res.PerNode) != 2 || res.PerNode[0].NodeID == res.PerNode[1].NodeID {
				t.Fatalf("per-node figures %+v, want two distinct nodes", res.PerNode)
			}
			var created, completed int64
			for _, n := range res.PerNode {
				created += n.Created
				completed += n.Completed
				if n.RedisCommandsPerJob <= 0 || n.NATSPerJob <= 0 {
					t.Errorf("node %s: no Redis or NATS traffic counted: %+v", n.NodeID, n)
				}
				if mode == NodeChild && (n.PID <= 0 || n.PID == os.Getpid() || n.CPUSec <= 0 || n.PeakRSSBytes <= 0) {
					t.Errorf("node %s: a child's pid, CPU and peak RSS are its own: %+v", n.NodeID, n)
				}
			}
			if mode == NodeChild && res.PerNode[0].PID == res.PerNode[1].PID {
				t.Errorf("both nodes report pid %d", res.PerNode[0].PID)
			}
			if created != int64(cfg.Jobs) {
				t.Errorf("the nodes created %d jobs between them, want %d (each job once)", created, cfg.Jobs)
			}
			// The report's end waits for the nodes' own counters: every job the
			// bench saw terminal is counted by the node that wrote it.
			if completed != int64(cfg.Jobs) {
				t.Errorf("the nodes completed %d jobs between them, want %d", completed, cfg.Jobs)
			}
			// Both nodes own jobs; each hears every result on the result
			// subject and keeps its jobs', so the shared consumer's copy is
			// forwarded only when the job's record is late to show it (two
			// nodes forwarded ~0.5 per job before), and no activation finds
			// the job busy.
			f := res.Forwarding
			if f == nil || f.PerJob > 0.25 || f.BusyActivations > int64(cfg.Jobs)/10 {
				t.Fatalf("forwarding %+v: want few results forwarded (results reach their owner), nearly no busy activation", f)
			}
			if !res.Node.Measured || res.Node.CPUSec <= 0 || !res.Redis.ClientMeasured || !res.NATS.NodeMeasured {
				t.Errorf("summed node figures missing: node %+v redis %+v nats %+v", res.Node, res.Redis, res.NATS)
			}
			if row := Row(res, ""); !strings.Contains(row, string(mode)+" ×2") {
				t.Errorf("row does not say two nodes: %s", row)
			}
		})
	}
}

// TestNodesConfig: several nodes run Troupe, started by the bench, without
// a hold.
func TestNodesConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c  Config
		ok bool
	}{
		{Config{}, true},
		{Config{Nodes: 3}, true},
		{Config{Nodes: 3, Node: NodeInProcess}, true},
		{Config{Nodes: -1}, false},
		{Config{Nodes: 2, Target: TargetFloor}, false},
		{Config{Nodes: 2, Node: NodeExternal, RunID: "x"}, false},
		{Config{Nodes: 2, Hold: true}, false},
		{Config{Nodes: 2, Adopt: true}, false},
	} {
		c := tc.c
		err := c.withDefaults()
		if (err == nil) != tc.ok || (err == nil && c.Nodes < 1) {
			t.Errorf("%+v: nodes %d, err %v; want ok %v", tc.c, c.Nodes, err, tc.ok)
		}
	}
	if ids := nodeIDs("r1", 1); len(ids) != 1 || ids[0] != "bench-r1" {
		t.Errorf("one node: %v", ids)
	}
	if ids := nodeIDs("r1", 3); len(ids) != 3 || ids[2] != "bench-r1-3" {
		t.Errorf("three nodes: %v", ids)
	}
	if p := nodeProfilePath("out/node.prof", 2); p != "out/node-2.prof" {
		t.Errorf("profile path %s", p)
	}
}

// TestReleasePublishesRefusedAnswersAgain: a result stream at its cap
// refuses the release's answers; the release publishes each refused one
// again until the stream, drained meanwhile, has stored every answer.
func TestReleasePublishesRefusedAnswersAgain(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	subj := bus.NewSubjects(env.Prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	const capMsgs, n = 10, 50
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: env.StreamPrefix() + "_RESULT",
		Subjects: []string{subj.Result}, Retention: jetstream.WorkQueuePolicy, MaxMsgs: capMsgs,
		Discard: jetstream.DiscardNew, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "drain", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{nc: env.NATS, subj: subj, ids: workerIDs(1), active: make([]atomic.Int32, 1), peak: make([]atomic.Int32, 1)}
	for k := range n {
		f.held = append(f.held, heldJob{w: 0, i: -1, trace: "t", id: fmt.Sprintf("rel-%d", k)})
	}
	// The drain starts once the stream is full, so the first answers past
	// its cap are refused.
	stored := make(chan map[string]bool, 1)
	go func() {
		seen := map[string]bool{}
		defer func() { stored <- seen }()
		for ctx.Err() == nil {
			if info, err := stream.Info(ctx); err == nil && info.State.Msgs >= capMsgs {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		for len(seen) < n && ctx.Err() == nil {
			batch, err := cons.Fetch(capMsgs, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				continue
			}
			for m := range batch.Messages() {
				if p, err := bus.Decode(m.Data()); err == nil {
					seen[p.GetJobResult().GetJobId()] = true
				}
				_ = m.Ack()
			}
		}
	}()
	answered, refused, err := f.releaseHeld(ctx)
	if err != nil || answered != n || refused == 0 {
		t.Fatalf("release: %d answered, %d refused, %v; want %d answered and some refused first", answered, refused, err, n)
	}
	if seen := <-stored; len(seen) != n {
		t.Fatalf("the stream stored %d distinct answers, want %d", len(seen), n)
	}
}

// TestBenchBatchSubmitSmoke: --submit-batch N (one wait for a batch's acks)
// and --submit-batch 1 with several submitters (one acked publish per job)
// each submit every job once: all SUCCEEDED, none received twice.
func TestBenchBatchSubmitSmoke(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name              string
		batch, submitters int
	}{{"batch64", 64, 1}, {"one-by-one", 1, 8}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := testenv.New(t)
			cfg := smokeConfig(t, env, TargetTroupe)
			cfg.SubmitBatch, cfg.Submitters = tc.batch, tc.submitters
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			res, err := Run(ctx, cfg)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			if j := res.Jobs; !res.OK || j.Succeeded != cfg.Jobs || j.Duplicates != 0 || j.NeverReceived != 0 {
				t.Fatalf("want %d SUCCEEDED exactly once; got %+v (failures %v)", cfg.Jobs, j, res.Failures)
			}
		})
	}
}

// keysConfig is a small concurrency-key run: 200 jobs over 10 keys limited
// to 2 each, 20 ms each, on two in-process nodes whose workers have far
// more slots (3×64) than the keys (10×2), so the keys are the bottleneck.
func keysConfig(t *testing.T, env *testenv.Env, suffix string) Config {
	cfg := smokeConfig(t, env, TargetTroupe)
	cfg.RunID = env.Prefix + suffix
	cfg.Jobs, cfg.Nodes, cfg.Delay = 200, 2, 20*time.Millisecond
	cfg.ConcurrencyKeys, cfg.KeyLimit = 10, 2
	return cfg
}

// TestBenchConcurrencyKeysSmoke: with every key limited to 2 on the nodes,
// the workers never hold more than 2 jobs of one key at once (0 key
// overfills), every job ends SUCCEEDED exactly once, and the report has the
// ideal makespan, ceil(200/(10×2)) × 20 ms = 200 ms.
func TestBenchConcurrencyKeysSmoke(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := keysConfig(t, env, "k")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	j, k := res.Jobs, res.Keys
	if !res.OK || j.Succeeded != cfg.Jobs || j.Duplicates != 0 || j.NeverReceived != 0 {
		t.Fatalf("want %d SUCCEEDED exactly once; got %+v (failures %v)", cfg.Jobs, j, res.Failures)
	}
	if k == nil || k.Overfills != 0 || k.MaxHeld < 1 || k.MaxHeld > 2 {
		t.Fatalf("keys %+v: want 0 overfills and at most 2 of one key held", k)
	}
	if k.IdealMakespanSec != 0.2 {
		t.Errorf("ideal makespan %v s, want 0.2", k.IdealMakespanSec)
	}
	var sum strings.Builder
	FormatReport(&sum, res)
	t.Log("\n" + sum.String())
}

// TestBenchConcurrencyKeysCountsOverfills: the same run with nodes that do
// not limit the keys shows over-fills — the workers' count can fail.
func TestBenchConcurrencyKeysCountsOverfills(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := keysConfig(t, env, "u")
	cfg.keysUnenforced = true
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if k := res.Keys; k == nil || k.Overfills == 0 || k.MaxHeld <= 2 {
		t.Fatalf("keys %+v: unlimited nodes, want overfills and more than 2 of a key held", k)
	}
}

// TestFleetCountsKeyOverfills: the workers count a key's jobs held at once,
// all workers together, and a receipt finding the key at its limit.
func TestFleetCountsKeyOverfills(t *testing.T) {
	t.Parallel()
	f := &fleet{}
	f.setKeys(3, 2)
	req := func(key string) *capv1.JobRequest {
		return &capv1.JobRequest{Meta: &capv1.JobMetadata{Labels: map[string]string{labelConcurrencyKey: key}}}
	}
	a := f.takeKey(req("ck1"))
	f.takeKey(req("ck1"))
	f.takeKey(req("ck2"))
	if held, over := f.keyCapacity(); held != 2 || over != 0 {
		t.Fatalf("2 of ck1 held: max %d, overfills %d; want 2 and 0", held, over)
	}
	f.takeKey(req("ck1")) // a third of ck1: an overfill
	f.releaseKey(a)
	f.takeKey(req("ck1")) // 3 again: another
	if held, over := f.keyCapacity(); held != 3 || over != 2 {
		t.Fatalf("max %d, overfills %d; want 3 and 2", held, over)
	}
	if k := f.takeKey(req("ck9")); k != -1 {
		t.Errorf("a key outside the run counted as %d", k)
	}
	if k := f.takeKey(&capv1.JobRequest{}); k != -1 {
		t.Errorf("a job with no key counted as %d", k)
	}
}

// TestConcurrencyKeysConfig: the key mode needs both numbers, Troupe nodes
// the bench starts and no hold; the ideal makespan is ceil(jobs/(keys×limit))
// rounds of the delay.
func TestConcurrencyKeysConfig(t *testing.T) {
	t.Parallel()
	ok := Config{Jobs: 10_000, ConcurrencyKeys: 100, KeyLimit: 2, Delay: time.Second, Node: NodeInProcess}
	if err := ok.withDefaults(); err != nil {
		t.Fatal(err)
	}
	if got := ok.IdealMakespan(); got != 50*time.Second {
		t.Errorf("ideal %v, want 50s", got)
	}
	odd := Config{Jobs: 201, ConcurrencyKeys: 10, KeyLimit: 2, Delay: 20 * time.Millisecond}
	if got := odd.IdealMakespan(); got != 220*time.Millisecond {
		t.Errorf("ideal for 201 jobs %v, want 220ms (11 rounds)", got)
	}
	for name, c := range map[string]Config{
		"no limit": {Jobs: 10, ConcurrencyKeys: 10},
		"no keys":  {Jobs: 10, KeyLimit: 2},
		"floor":    {Jobs: 10, ConcurrencyKeys: 10, KeyLimit: 2, Target: TargetFloor},
		"hold":     {Jobs: 10, ConcurrencyKeys: 10, KeyLimit: 2, Hold: true},
		"negative": {Jobs: 10, ConcurrencyKeys: -1, KeyLimit: 2},
		"external": {Jobs: 10, ConcurrencyKeys: 10, KeyLimit: 2, Node: NodeExternal, RunID: "x1"},
	} {
		if err := c.withDefaults(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}

// TestFleetMeasuresKeyHandOffs: a receipt of a key is timed from the
// oldest answer of that key not yet followed by one; a receipt with no
// earlier answer (a free slot) is no hand-off; gaps of receipts 20 s or
// more into the run are also counted apart.
func TestFleetMeasuresKeyHandOffs(t *testing.T) {
	t.Parallel()
	f := &fleet{}
	f.setKeys(2, 1)
	ms := int64(time.Millisecond)
	f.keyGap(0, 5*ms) // the first of key 0: no answer before it
	f.keyFreedAt(0, 10*ms)
	f.keyFreedAt(0, 20*ms)
	f.keyFreedAt(1, 30*ms)
	f.keyGap(0, 40*ms)                          // 30 ms after the answer at 10
	f.keyGap(1, 100*ms)                         // 70 ms
	f.keyGap(0, int64(keyLateAfter)+20*ms+5*ms) // late: 20 s + 5 ms after the answer at 20
	n, mean, p50, _, _, mx := f.keyGapStats()
	if n != 3 || p50 != 70 || mx != 20005 || mean != 6701.67 { // (30+70+20005)/3
		t.Fatalf("gaps: n %d mean %v p50 %v max %v", n, mean, p50, mx)
	}
	if ln, lmean := f.keyLateGaps(); ln != 1 || lmean != 20005 {
		t.Fatalf("late gaps: %d, mean %v; want 1, 20005", ln, lmean)
	}
	f.resetCapacity()
	if n, _, _, _, _, _ := f.keyGapStats(); n != 0 {
		t.Fatalf("%d gaps after the reset", n)
	}
}
