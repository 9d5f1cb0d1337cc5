// Package faults holds tests that run real `troupe node` processes and
// break them.
package faults_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// buildTroupe builds the troupe binary once per test binary.
var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// TROUPE_FAULTS_BIN names a troupe binary built beforehand instead (to
// run a base commit's binary under this commit's tests).
func troupeBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if bin := os.Getenv("TROUPE_FAULTS_BIN"); bin != "" {
			binPath = bin
			return
		}
		dir, err := os.MkdirTemp("", "troupe-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "troupe")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/troupe-run/troupe/cmd/troupe").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// startNode runs `troupe node` as a child process on the test's prefixes.
func startNode(t *testing.T, env *testenv.Env, id string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(troupeBinary(t), "node", "--id", id, "--nats", env.NATSURL, "--redis", env.RedisURL,
		"--key-prefix", env.KeyPrefix(), "--subject-prefix", env.Prefix, "--stream-prefix", env.StreamPrefix(),
		"--lock-ttl", "2s", "--admin-listen", "", "--log-level", "warn")
	logf, err := os.Create(filepath.Join(t.TempDir(), id+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("%s log:\n%s", id, b)
		}
	})
	return cmd
}

// TestKillNodeMidRun kills one of two `troupe node` processes (SIGKILL)
// while the jobs it dispatched are with a worker. Every job must still
// reach SUCCEEDED, none may reach a worker twice, and the dead node's jobs
// are adopted by the survivor (its results applied after the dead node's
// locks expire, or its leases run out).
func TestKillNodeMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs two node processes")
	}
	env := testenv.New(t)
	a := startNode(t, env, "fault-a")
	startNode(t, env, "fault-b")

	subj := bus.NewSubjects(env.Prefix)
	var mu sync.Mutex
	receipts := map[string]int{}
	got := make(chan string, 1000)
	release := make(chan struct{})
	w, err := worker.Start(env.NATS, worker.Config{ID: "fw", Pool: "default", Topics: []string{"job.echo"}, Direct: true,
		SubjectPrefix: subj.Prefix(), Heartbeat: 500 * time.Millisecond, MaxParallel: 1000,
		OnReceive: func(_ string, req *capv1.JobRequest) {
			mu.Lock()
			receipts[req.JobId]++
			mu.Unlock()
			got <- req.JobId
		},
		Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return worker.Echo(ctx, req)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The nodes create the streams when they start.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := js.Stream(ctx, bus.StreamName(env.StreamPrefix(), bus.StreamSubmit)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nodes never created their streams")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Both nodes must be pulling submits, or one may take every job.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		cons, err := js.Consumer(ctx, bus.StreamName(env.StreamPrefix(), bus.StreamSubmit), bus.ConsumerName(bus.StreamSubmit))
		if err == nil {
			if info, err := cons.Info(ctx); err == nil && info.NumWaiting >= 2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the two nodes never both pulled from the submit stream")
		}
	}
	const jobs = 200
	for i := 0; i < jobs; i++ {
		id := fmt.Sprintf("kill-%d", i)
		data, _ := bus.EncodeRequest(id, "fault-test", &capv1.JobRequest{JobId: id, Topic: "job.echo"})
		if _, err := js.Publish(ctx, subj.Submit, data); err != nil {
			t.Fatal(err)
		}
	}
	timeout := time.After(60 * time.Second)
	for n := 0; n < jobs; n++ {
		select {
		case <-got:
		case <-timeout:
			t.Fatalf("only %d of %d jobs reached the worker", n, jobs)
		}
	}

	// Kill node A while the worker holds every job.
	opt, _ := redis.ParseURL(env.RedisURL)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	st := store.New(rdb, store.Config{Prefix: env.KeyPrefix()})
	ownedByA := 0
	for i := 0; i < jobs; i++ {
		if r, err := st.GetJob(ctx, fmt.Sprintf("kill-%d", i)); err == nil && r.Node == "fault-a" {
			ownedByA++
		}
	}
	if err := a.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	close(release)

	deadline := time.Now().Add(90 * time.Second)
	for i := 0; i < jobs; i++ {
		id := fmt.Sprintf("kill-%d", i)
		for {
			r, err := st.GetJob(ctx, id)
			if err == nil && r.State == jobstate.StateSucceeded {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not SUCCEEDED 90 s after the kill: %+v %v", id, r, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	twice := 0
	for _, n := range receipts {
		if n > 1 {
			twice++
		}
	}
	t.Logf("kill -9 of 1 of 2 nodes with %d jobs held (%d owned by the killed node): all %d SUCCEEDED %v after the kill; %d received twice",
		jobs, ownedByA, jobs, time.Since(killed).Round(time.Millisecond), twice)
	if twice != 0 {
		t.Fatalf("%d jobs reached a worker twice", twice)
	}
	if ownedByA == 0 {
		t.Fatal("the killed node owned no job; the test proved nothing")
	}
}
