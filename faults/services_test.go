package faults_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/testhook"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitPort(t *testing.T, port int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 100*time.Millisecond); err == nil {
			c.Close()
			return
		}
	}
	t.Fatalf("nothing listens on %d", port)
}

// privateServer runs a server binary of our own (so faults touch nobody else).
func privateServer(t *testing.T, bin string, args ...string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath(bin); err != nil {
		t.Skipf("%s not installed", bin)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
	})
	return cmd
}

// world is an in-process node and worker on private servers.
type world struct {
	t        *testing.T
	node     *troupe.Node
	js       jetstream.JetStream
	subj     bus.Subjects
	mu       sync.Mutex
	receipts map[string]int
}

func newWorld(t *testing.T, natsURL, redisURL string) *world {
	pools, _ := troupe.ParsePools([]byte("topics:\n  job.echo: default\n"))
	cfg := troupe.Config{NodeID: "fault-n", NATSURL: natsURL, RedisURL: redisURL, Pools: pools,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	testhook.SetBackoff(&cfg, func(int) time.Duration { return 200 * time.Millisecond })
	node, err := troupe.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	w := &world{t: t, node: node, subj: inspect.Of(node).Subjects(), receipts: map[string]int{}}
	// Deduping, as `troupe worker` is by default: a direct dispatch lost on
	// the wire (a slow consumer under a flood of 1 MiB packets, say) is
	// resent. (CI saw one job wait for ever on a non-deduping worker.)
	wk, err := worker.Start(nc, worker.Config{ID: "fw", Pool: "default", Topics: []string{"job.echo"}, Direct: true,
		Dedupe: true, SubjectPrefix: w.subj.Prefix(), Heartbeat: 500 * time.Millisecond, MaxParallel: 1000,
		OnReceive: func(_ string, req *capv1.JobRequest) { w.mu.Lock(); w.receipts[req.JobId]++; w.mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wk.Stop)
	w.js, _ = jetstream.New(nc)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if ws, err := inspect.Of(node).Workers(); err == nil && len(ws) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("worker never registered")
		}
	}
	return w
}

// submitFor submits jobs at rate per second for d, from a goroutine; the
// ids come back on the channel when it is done.
func (w *world) submitFor(prefix string, rate int, d time.Duration) <-chan []string {
	out := make(chan []string, 1)
	go func() {
		var ids []string
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		end := time.Now().Add(d)
		for n := 0; time.Now().Before(end); n++ {
			<-tick.C
			id := fmt.Sprintf("%s-%d", prefix, n)
			// A publish can fail while NATS restarts, or go unanswered
			// when it reached a server on its way down; the client
			// retries with a fresh deadline per try, as a real one would
			// (a duplicate submit changes nothing). One shared deadline
			// here once let a publish lost in the shutdown use it up, so
			// the retries never ran and the job was never submitted.
			if err := submitRetrying(w.js, w.subj.Submit, "fault-test", id, 100); err != nil {
				w.t.Error(err)
				continue
			}
			ids = append(ids, id)
		}
		out <- ids
	}()
	return out
}

// check waits until every job is SUCCEEDED and none reached the worker twice.
func (w *world) check(ids []string, within time.Duration) {
	w.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(within)
	for _, id := range ids {
		for {
			r, err := inspect.Of(w.node).Job(ctx, id)
			if err == nil && r.State == jobstate.StateSucceeded {
				break
			}
			if time.Now().After(deadline) {
				w.t.Fatalf("%s not SUCCEEDED: %+v %v", id, r, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for id, n := range w.receipts {
		if n > 1 {
			w.t.Errorf("%s reached the worker %d times", id, n)
		}
	}
}

// Redis stops answering for 5 s (SIGSTOP, then SIGCONT) under a steady
// stream of jobs: the node fails closed (nothing dispatched on unknown
// state), reports not ready, and every job succeeds once Redis is back.
func TestRedisPausedFiveSeconds(t *testing.T) {
	if testing.Short() {
		t.Skip("runs its own redis-server and nats-server")
	}
	rport, nport := freePort(t), freePort(t)
	redisSrv := privateServer(t, "redis-server", "--port", strconv.Itoa(rport), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no")
	privateServer(t, "nats-server", "-a", "127.0.0.1", "-p", strconv.Itoa(nport), "-js", "-sd", t.TempDir())
	waitPort(t, rport)
	waitPort(t, nport)
	w := newWorld(t, "nats://127.0.0.1:"+strconv.Itoa(nport), "redis://127.0.0.1:"+strconv.Itoa(rport))

	done := w.submitFor("rp", 100, 10*time.Second)
	time.Sleep(2 * time.Second)
	if err := redisSrv.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	readyErr := w.node.Ready(ctx)
	cancel()
	time.Sleep(3500 * time.Millisecond)
	if err := redisSrv.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	if readyErr == nil {
		t.Error("the node said it was ready while Redis did not answer")
	}
	ids := <-done
	w.check(ids, 60*time.Second)
	t.Logf("Redis paused 5 s under 100 jobs/s: %d jobs, all SUCCEEDED %v after it resumed, 0 twice; ready during the pause: %v",
		len(ids), time.Since(resumed).Round(time.Millisecond), readyErr)
}

// The NATS server restarts under a steady stream of jobs (its JetStream
// store survives): streams, consumers and subscriptions come back, and
// every job succeeds, none twice.
func TestNATSRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("runs its own redis-server and nats-server")
	}
	rport, nport := freePort(t), freePort(t)
	store := t.TempDir()
	privateServer(t, "redis-server", "--port", strconv.Itoa(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	natsArgs := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(nport), "-js", "-sd", store}
	natsSrv := privateServer(t, "nats-server", natsArgs...)
	waitPort(t, rport)
	waitPort(t, nport)
	w := newWorld(t, "nats://127.0.0.1:"+strconv.Itoa(nport), "redis://127.0.0.1:"+strconv.Itoa(rport))

	done := w.submitFor("nr", 100, 8*time.Second)
	time.Sleep(2 * time.Second)
	_ = natsSrv.Process.Signal(syscall.SIGTERM)
	_, _ = natsSrv.Process.Wait()
	down := time.Now()
	time.Sleep(time.Second)
	privateServer(t, "nats-server", natsArgs...)
	waitPort(t, nport)
	t.Logf("nats-server was down %v", time.Since(down).Round(time.Millisecond))
	ids := <-done
	w.check(ids, 90*time.Second)
	t.Logf("NATS restarted under 100 jobs/s: %d jobs, all SUCCEEDED, 0 twice", len(ids))
	_ = os.Remove(store)
}
