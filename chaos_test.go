package troupe_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// TestRandomInterleavingsKeepTheInvariants runs many jobs while a chaos loop
// interleaves duplicate submits, duplicate and early results, cancels, lock
// theft (another "owner" takes the lock for a moment) and actor crashes.
// Whatever happens, two invariants must hold for every job:
//  1. a job a worker received is never dispatched again (a stale owner's
//     DISPATCHED write is fenced before it can publish);
//  2. a terminal job never changes state (its history ends at its first
//     terminal entry), and every step of its history is a legal transition.
func TestRandomInterleavingsKeepTheInvariants(t *testing.T) {
	t.Parallel()
	jobs := 2000
	if testing.Short() {
		jobs = 300
	}
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.Timeouts = &troupe.Timeouts{Dispatch: 2 * time.Second, Running: 2 * time.Second}
		c.Tuning.DuePoll = 50 * time.Millisecond
		c.Tuning.DueSlack = 50 * time.Millisecond
		c.Tuning.RescueAfter = time.Second
		troupe.SetBackoff(c, func(int) time.Duration { return 20 * time.Millisecond })
	})
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	var rngMu sync.Mutex
	intn := func(n int) int { rngMu.Lock(); defer rngMu.Unlock(); return rng.IntN(n) }

	rec := newReceipts()
	rec.ch = make(chan string, jobs*2)
	nc := f.env.NATS
	publishResult := func(id string, st capv1.JobStatus) {
		data, _ := bus.EncodeResult(id, "chaos", &capv1.JobResult{JobId: id, Status: st, WorkerId: "w-chaos"})
		_ = nc.Publish(f.subj.Result, data)
	}
	handler := func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		time.Sleep(time.Duration(intn(30)) * time.Millisecond)
		switch intn(10) {
		case 0:
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED, ErrorCode: "chaos"}
		case 1: // a duplicate result races the real one
			publishResult(req.JobId, capv1.JobStatus_JOB_STATUS_SUCCEEDED)
		case 2: // progress first
			publishResult(req.JobId, capv1.JobStatus_JOB_STATUS_RUNNING)
		}
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
	}
	for i := 0; i < 3; i++ {
		w, err := worker.Start(nc, worker.Config{ID: fmt.Sprintf("w%d", i), Pool: "echo", Topics: []string{"job.echo"},
			Direct: i != 2, SubjectPrefix: f.subj.Prefix(), Handler: handler, Heartbeat: time.Second, MaxParallel: 4096, OnReceive: rec.hook})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
	}
	f.waitWorkers(3)

	ids := make([]string, jobs)
	for i := range ids {
		ids[i] = fmt.Sprintf("chaos-%d", i)
	}
	ctx := context.Background()
	keys := store.NewKeys(f.env.KeyPrefix())
	chaosDone := make(chan struct{})
	var injected [5]int
	go func() {
		defer close(chaosDone)
		deadline := time.Now().Add(4 * time.Second)
		for n := 0; n < jobs*2 && time.Now().Before(deadline); n++ {
			id := ids[intn(len(ids))]
			k := intn(5)
			injected[k]++
			switch k {
			case 0:
				f.submit(echoReq(id))
			case 1:
				publishResult(id, capv1.JobStatus_JOB_STATUS_SUCCEEDED)
			case 2:
				_ = f.node.Cancel(ctx, id, "chaos", "chaos")
			case 3: // another owner holds the lock for a moment
				f.env.Redis.Set(ctx, keys.Lock(id), "intruder|999", time.Duration(50+intn(200))*time.Millisecond)
			case 4:
				f.node.DeliverToJob(id, &jobactor.Crash{})
			}
			if n%20 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	for _, id := range ids {
		f.submit(echoReq(id))
	}
	<-chaosDone
	t.Logf("injected: %d duplicate submits, %d stray results, %d cancels, %d lock thefts, %d crashes",
		injected[0], injected[1], injected[2], injected[3], injected[4])

	// Let the system settle: every job terminal, or the time bound passes.
	deadline := time.Now().Add(30 * time.Second)
	terminal := 0
	for time.Now().Before(deadline) {
		terminal = 0
		for _, id := range ids {
			if r, err := f.node.Record(ctx, id); err == nil && r.State.Terminal() {
				terminal++
			}
		}
		if terminal == jobs {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	byState := map[jobstate.State]int{}
	for _, id := range ids {
		r, err := f.node.Record(ctx, id)
		if err != nil {
			es, _ := f.node.Store().ListDLQ(ctx, 10000)
			for _, e := range es {
				if e.JobID == id {
					t.Logf("dlq: %+v", e)
				}
			}
			t.Fatalf("%s: %v (receipts %d)", id, err, rec.count(id))
		}
		byState[r.State]++
		if n := rec.count(id); n > 1 {
			t.Errorf("%s was received %d times by workers: %s", id, n, reasons(r.History))
		}
		seenTerminal := false
		for i, h := range r.History {
			if seenTerminal {
				t.Errorf("%s changed after a terminal state: %s", id, reasons(r.History))
				break
			}
			if i > 0 && !lifecycle.Legal(r.History[i-1].To, h.To) {
				t.Errorf("%s: illegal step %s → %s", id, r.History[i-1].To, h.To)
			}
			seenTerminal = h.To.Terminal()
		}
		if seenTerminal && r.State != r.History[len(r.History)-1].To {
			t.Errorf("%s: state %s differs from history end", id, r.State)
		}
	}
	t.Logf("%d jobs, %d terminal: %v", jobs, terminal, byState)
	// Every live job has a due entry, so none is stranded by a crash.
	if terminal != jobs {
		t.Errorf("%d jobs never reached a terminal state: %v", jobs-terminal, byState)
	}
}
