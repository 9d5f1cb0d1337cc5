package store_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// These benchmarks run the store's hot path against the test Redis (the real
// one when it answers): a job actor's transitions go through the Writer, which
// groups concurrent ops into pipelines.

const benchNode = "bench-node"

func newBenchWriter(b *testing.B) (*store.Store, *store.Writer) {
	b.Helper()
	env := testenv.New(b)
	s := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	if err := s.LoadScripts(context.Background()); err != nil {
		b.Fatal(err)
	}
	w := s.NewWriter(0, 0, 0)
	b.Cleanup(w.Close)
	return s, w
}

// do submits op and waits for its result, as a job actor does (it has one op
// outstanding at a time).
func do(b *testing.B, w *store.Writer, op *store.Op) *store.Result {
	done := make(chan *store.Result, 1)
	op.Done = func(r *store.Result) { done <- r }
	w.Submit(op)
	r := <-done
	if r.Err != nil {
		b.Fatal(r.Err)
	}
	return r
}

// benchJob is one job held by the benchmark, cycling through
// SCHEDULED → DISPATCHED → RUNNING → SCHEDULED, each step a fenced transition.
type benchJob struct {
	id, lock string
	state    jobstate.State
}

func activate(b *testing.B, w *store.Writer, id string) *benchJob {
	r := do(b, w, &store.Op{Kind: store.OpActivate, JobID: id, Node: benchNode, Create: true, Topic: "job.bench",
		Request: []byte("req")})
	if r.Status != store.ActivateCreated {
		b.Fatalf("activate %s: %s", id, r.Status)
	}
	j := &benchJob{id: id, lock: jobstate.LockValue(benchNode, r.Fence), state: jobstate.StatePending}
	j.step(b, w, jobstate.StateScheduled, nil)
	return j
}

func (j *benchJob) step(b *testing.B, w *store.Writer, to jobstate.State, fields []string) {
	r := do(b, w, &store.Op{Kind: store.OpTransition, JobID: j.id, Node: benchNode, LockValue: j.lock,
		T: &store.Transition{Expect: jobstate.Expect(j.state), Path: []store.Hop{{To: to, Reason: jobstate.Reason("bench")}},
			Fields: fields}})
	if !r.OK() {
		b.Fatalf("%s → %s: %+v", j.state, to, r.Step)
	}
	j.state = to
}

var dispatchFields = []string{"worker", "bw1", "subj", "worker.bw1.jobs", "attempts", "1"}

func (j *benchJob) next(b *testing.B, w *store.Writer) {
	switch j.state {
	case jobstate.StateScheduled:
		j.step(b, w, jobstate.StateDispatched, dispatchFields)
	case jobstate.StateDispatched:
		j.step(b, w, jobstate.StateRunning, nil)
	default:
		j.step(b, w, jobstate.StateScheduled, nil)
	}
}

// BenchmarkTransition is one fenced transition at a time: a round trip each,
// the latency a single job actor sees.
func BenchmarkTransition(b *testing.B) {
	_, w := newBenchWriter(b)
	jobs := make([]*benchJob, 64)
	for i := range jobs {
		jobs[i] = activate(b, w, "tr-"+strconv.Itoa(i))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		jobs[i%len(jobs)].next(b, w)
		i++
	}
}

// BenchmarkTransitionParallel is many job actors' transitions at once; the
// Writer batches them, so ns/op is the amortised cost of one transition.
// -cpu sets GOMAXPROCS; the parallelism is 64 actors per P.
func BenchmarkTransitionParallel(b *testing.B) {
	_, w := newBenchWriter(b)
	b.SetParallelism(64)
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		g := n.Add(1)
		jobs := make([]*benchJob, 4)
		for i := range jobs {
			jobs[i] = activate(b, w, "tp-"+strconv.FormatInt(g, 10)+"-"+strconv.Itoa(i))
		}
		i := 0
		for pb.Next() {
			jobs[i%len(jobs)].next(b, w)
			i++
		}
	})
}

// BenchmarkJobHappyPath is the store work of one job on the node's happy path,
// as the job actor issues it: create + PENDING → SCHEDULED → DISPATCHED in one
// activation, then DISPATCHED → RUNNING → SUCCEEDED in one transition — two
// ops, two scripts. Many jobs run at once (64 per P), as under load.
func BenchmarkJobHappyPath(b *testing.B) {
	_, w := newBenchWriter(b)
	b.SetParallelism(64)
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := "hp-" + strconv.FormatInt(n.Add(1), 10)
			r := do(b, w, &store.Op{Kind: store.OpActivate, JobID: id, Node: benchNode, Create: true,
				Topic: "job.bench", Request: []byte("req"), T: &store.Transition{
					Path: []store.Hop{{To: jobstate.StateScheduled, Reason: jobstate.Reason("allowed")},
						{To: jobstate.StateDispatched, Reason: jobstate.Reason("dispatched")}},
					Due: time.Now().Add(5 * time.Minute).UnixMilli(), Fields: dispatchFields}})
			if r.Status != store.ActivateCreated || r.State != jobstate.StateDispatched {
				b.Fatalf("dispatch %s: %+v", id, r)
			}
			lock := jobstate.LockValue(benchNode, r.Fence)
			r = do(b, w, &store.Op{Kind: store.OpTransition, JobID: id, Node: benchNode, LockValue: lock,
				T: &store.Transition{Expect: jobstate.Expect(jobstate.StateDispatched),
					Path: []store.Hop{{To: jobstate.StateRunning, Reason: jobstate.Reason("started")},
						{To: jobstate.StateSucceeded, Reason: jobstate.Reason("completed")}},
					Fields: []string{"result_ptr", "redis://res:" + id}}})
			if !r.OK() {
				b.Fatalf("finish %s: %+v", id, r.Step)
			}
		}
	})
}
