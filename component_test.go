package troupe_test

import (
	"context"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// componentNode is a node on env's own connections, so that what the node
// leaves subscribed shows on env.NATS.
func componentNode(t *testing.T, env *testenv.Env) *troupe.Node {
	t.Helper()
	pools, err := parseTestPools()
	if err != nil {
		t.Fatal(err)
	}
	node, err := troupe.NewNode(troupe.Config{NodeID: "node-c", NATS: env.NATS, Redis: env.Client,
		KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(),
		Pools: pools, Tuning: troupe.Tuning{LockTTL: 3 * time.Second}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	return node
}

// goroutines counts the live goroutines by where they were created and the
// function they run, with one stack of each for the failure message.
// inProcessServer reports whether goroutine stack g is one of the
// in-process test servers' own (the embedded nats-server and Redis-protocol
// store serving a connection or a consumer): they end on the server's
// schedule, which a loaded machine stretches past the wait; what a node
// leaves open shows in its own goroutines and subscriptions.
func inProcessServer(g string) bool {
	_, created, ok := strings.Cut(g, "\ncreated by ")
	return ok && (strings.Contains(created, "nats-io/nats-server/") || strings.Contains(created, "alicebob/miniredis/"))
}

func goroutines() (map[string]int, map[string]string) {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	counts, stacks := map[string]int{}, map[string]string{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		lines := strings.Split(strings.TrimSpace(g), "\n")
		if len(lines) < 2 {
			continue
		}
		if inProcessServer(g) || connectionOwn(g) {
			continue
		}
		key := frameFunc(lines[1])
		for _, l := range lines {
			if strings.HasPrefix(l, "created by ") {
				key += " <- " + frameFunc(strings.TrimPrefix(l, "created by "))
			}
		}
		counts[key]++
		stacks[key] = g
	}
	return counts, stacks
}

// connectionOwn reports whether goroutine stack g is one a NATS
// connection runs for itself (its flusher and read loop, made again by
// every reconnect): these nodes are given the test's connection and open
// none, and any connection in the test binary that reconnects while the
// counts are taken (a ping missed under -race on a loaded machine) moves
// them without the node having left anything; what a node leaves open on
// a connection shows as its subscriptions.
//
// A stack names the package as its import path escaped for the runtime:
// nats.go's last element holds a dot, printed "nats%2ego" (a match on
// "nats.go" found none, and the filter did nothing).
func connectionOwn(g string) bool {
	_, created, ok := strings.Cut(g, "\ncreated by ")
	return ok && strings.Contains(created, "github.com/nats-io/nats%2ego.(*Conn).processConnectInit")
}

var frameArgs = regexp.MustCompile(`\(.*\)$|\sin goroutine \d+$`)

func frameFunc(line string) string { return frameArgs.ReplaceAllString(strings.TrimSpace(line), "") }

// leftGoroutines waits (boundedly) until no kind of goroutine outnumbers
// its count in before, and returns the stacks of the kinds that still do.
func leftGoroutines(before map[string]int) []string {
	deadline := time.Now().Add(15 * time.Second)
	for {
		now, stacks := goroutines()
		var left []string
		for k, c := range now {
			if c > before[k] {
				left = append(left, stacks[k])
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			sort.Strings(left)
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Each component's start, made to fail in turn, fails Start with an error
// naming it and leaves nothing behind: no goroutine (pollers, loops,
// timers, actors), no NATS subscription, no node lease in Redis. A node
// stops its components in the reverse of their start order.
func TestComponentStartFailureLeavesNothingBehind(t *testing.T) {
	env := testenv.New(t)
	keys := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()}).Keys()
	leaseLeft := func(t *testing.T) []string {
		t.Helper()
		var left []string
		for i := 0; i < store.Shards; i++ {
			k := keys.Alive(i, "node-c")
			n, err := env.Client.Exists(context.Background(), k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				left = append(left, k)
			}
		}
		return left
	}

	// A request opens the connection's response subscription, which it
	// keeps (nats.go): the node's JetStream calls would open it otherwise.
	_, _ = env.NATS.Request(env.Prefix+".nobody", nil, 10*time.Millisecond)
	subs := env.NATS.NumSubscriptions()
	subsLeft := func() int {
		deadline := time.Now().Add(15 * time.Second)
		for env.NATS.NumSubscriptions() > subs && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		return env.NATS.NumSubscriptions() - subs
	}

	// A full start and stop, recorded: the component names, and the stop
	// order. It also starts what a process starts once (protoactor's and
	// the clients' shared goroutines), before the counts below.
	var (
		mu     sync.Mutex
		events []string
	)
	node := componentNode(t, env)
	node.RecordComponents(func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := node.Start(ctx); err == nil {
		t.Fatal("a second Start of a started node succeeded")
	}
	if err := node.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := node.Start(ctx); err == nil {
		t.Fatal("Start after Stop succeeded")
	}
	var started, stopped []string
	for _, e := range events {
		if name, ok := strings.CutPrefix(e, "start "); ok {
			started = append(started, name)
		} else {
			stopped = append(stopped, strings.TrimPrefix(e, "stop "))
		}
	}
	if len(started) < 20 {
		t.Fatalf("only %d components started: %v", len(started), started)
	}
	reversed := slices.Clone(started)
	slices.Reverse(reversed)
	if !slices.Equal(stopped, reversed) {
		t.Fatalf("stop order %v, want the reverse of the start order %v", stopped, started)
	}
	if left := leaseLeft(t); len(left) > 0 {
		t.Fatalf("a stopped node left its lease: %v", left)
	}
	if left := subsLeft(); left != 0 {
		t.Fatalf("a stopped node left %d NATS subscriptions", left)
	}

	for _, name := range started {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			before, _ := goroutines()
			node := componentNode(t, env)
			var stops []string
			node.RecordComponents(func(e string) {
				if s, ok := strings.CutPrefix(e, "stop "); ok {
					stops = append(stops, s)
				}
			})
			node.FailStartOf(name)
			err := node.Start(ctx)
			if err == nil || !strings.Contains(err.Error(), "start "+name+":") {
				t.Fatalf("Start with %s failing: err %v, want one naming it", name, err)
			}
			at := slices.Index(started, name)
			want := slices.Clone(started[:at])
			slices.Reverse(want)
			if !slices.Equal(stops, want) {
				t.Errorf("stopped %v, want %v", stops, want)
			}
			if left := leftGoroutines(before); len(left) > 0 {
				t.Fatalf("%d kinds of goroutine left behind:\n%s", len(left), strings.Join(left, "\n\n"))
			}
			if left := subsLeft(); left != 0 {
				t.Errorf("%d NATS subscriptions left", left)
			}
			// No goroutine is left to renew it: a lease key left now stays.
			if left := leaseLeft(t); len(left) > 0 {
				t.Errorf("the node lease is left: %v", left)
			}
			if err := node.Start(ctx); err == nil || !strings.Contains(err.Error(), "build a new node") {
				t.Errorf("Start after a failed Start: err %v, want it refused", err)
			}
			if err := node.Stop(ctx); err != nil {
				t.Errorf("Stop after a failed Start: %v", err)
			}
		})
	}
}

// Stop called while Start runs makes Start stop before its next component
// and fail; Stop returns once what had started is stopped, and nothing is
// left behind.
func TestComponentStopDuringStartStopsWhatStarted(t *testing.T) {
	env := testenv.New(t)
	_, _ = env.NATS.Request(env.Prefix+".nobody", nil, 10*time.Millisecond)
	// A first node starts what a process starts once.
	warm := componentNode(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := warm.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := warm.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	subs := env.NATS.NumSubscriptions()
	before, _ := goroutines()

	node := componentNode(t, env)
	stopped := make(chan error, 1)
	node.RecordComponents(func(e string) {
		if e != "start writer" {
			return
		}
		go func() { stopped <- node.Stop(ctx) }()
		for deadline := time.Now().Add(10 * time.Second); !node.StopAsked(); {
			if time.Now().After(deadline) {
				t.Error("Stop did not reach the starting node in 10 s")
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	err := node.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), "stopped while it started") {
		t.Fatalf("Start stopped while starting: err %v", err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if left := leftGoroutines(before); len(left) > 0 {
		t.Fatalf("%d kinds of goroutine left behind:\n%s", len(left), strings.Join(left, "\n\n"))
	}
	for deadline := time.Now().Add(15 * time.Second); env.NATS.NumSubscriptions() > subs && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if got := env.NATS.NumSubscriptions(); got != subs {
		t.Errorf("%d NATS subscriptions left", got-subs)
	}
}

// connectionOwn knows a NATS connection's own goroutines as the runtime
// prints them (the flusher below is the stack a loaded -race run left).
func TestConnectionOwnKnowsANATSConnectionsGoroutines(t *testing.T) {
	flusher := "goroutine 1895 [chan receive]:\n" +
		"github.com/nats-io/nats%2ego.(*Conn).flusher(0xc00014d508)\n" +
		"\t/root/go/pkg/mod/github.com/nats-io/nats.go@v1.55.0/nats.go:4245 +0x1b4\n" +
		"created by github.com/nats-io/nats%2ego.(*Conn).processConnectInit in goroutine 1890\n" +
		"\t/root/go/pkg/mod/github.com/nats-io/nats.go@v1.55.0/nats.go:2986 +0x4f1"
	if !connectionOwn(flusher) {
		t.Error("a connection's flusher not known as the connection's own")
	}
	nodes := "goroutine 7 [select]:\n" +
		"github.com/troupe-run/troupe/internal/bus.fetchLoop(0xc000100000)\n" +
		"\t/x/internal/bus/pull.go:1 +0x1\n" +
		"created by github.com/troupe-run/troupe/internal/bus.Consume in goroutine 1\n" +
		"\t/x/internal/bus/pull.go:2 +0x2"
	if connectionOwn(nodes) {
		t.Error("a node's fetch loop taken for a connection's own goroutine")
	}
	// The live process agrees: the test's connection's own goroutines are
	// all filtered out of the counts.
	env := testenv.New(t)
	_ = env.NATS.Flush()
	_, stacks := goroutines()
	for _, g := range stacks {
		if strings.Contains(g, "(*Conn).flusher(") || strings.Contains(g, "(*Conn).readLoop(") {
			t.Errorf("a connection's own goroutine counted:\n%s", g)
		}
	}
}
