package troupe_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Tests of parked retry waits: a failed attempt whose backoff is at least
// Tuning.RetryParkMin waits with no actor and no lock; the due set brings
// it back at its retry time, on any replica.

// parkRetries parks retry waits of 300 ms or more and polls fast.
func parkRetries(c *troupe.Config) {
	c.Tuning.RetryParkMin = 300 * time.Millisecond
	c.Tuning.DuePoll = 50 * time.Millisecond
	c.Tuning.DueSlack = 50 * time.Millisecond
}

// longRetryReq is a job of 3 attempts whose retry backs off backoff/2 to
// backoff (the policy's jitter).
func longRetryReq(id string, backoff time.Duration) *capv1.JobRequest {
	req := echoReq(id)
	req.Meta = &capv1.JobMetadata{Labels: map[string]string{jobstate.LabelRetryAttempts: "3",
		jobstate.LabelRetryBackoffMin: backoff.String(), jobstate.LabelRetryBackoffMax: backoff.String()}}
	return req
}

// waitRetryParked waits until job id waits for attempt 2 with no lock and
// no live actor on n, and returns its record. The wait must still be on:
// a job seen past it fails the test.
func (f *fixture) waitRetryParked(n *troupe.Node, id string) *store.JobRecord {
	f.t.Helper()
	ctx := context.Background()
	lockKey := store.NewKeys(f.env.KeyPrefix()).Lock(id)
	deadline := time.Now().Add(15 * time.Second)
	for {
		rec, err := n.Record(ctx, id)
		lock := f.env.Redis.Get(ctx, lockKey).Val()
		live, _ := n.LiveJobActors()
		if err == nil && rec.State == jobstate.StateScheduled && rec.Reason == jobstate.ReasonRetryWait &&
			rec.Fields[jobstate.FieldTry] == "2" && lock == "" && live == 0 {
			return rec
		}
		if err == nil && rec.Fields[jobstate.FieldTry] == "2" && rec.State != jobstate.StateScheduled {
			f.t.Fatalf("job %s left its retry wait (%s) before it was seen parked", id, rec.State)
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("job %s never parked its retry wait: record %+v, lock %q, %d actors live", id, rec, lock, live)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// attemptsOf checks the job's record after it ended: want dispatches,
// want−1 retry waits.
func attemptsOf(t *testing.T, rec *store.JobRecord, want int) {
	t.Helper()
	dispatches, waits := 0, 0
	for _, hop := range rec.History {
		switch {
		case hop.To == jobstate.StateDispatched:
			dispatches++
		case hop.Reason == jobstate.ReasonRetryWait:
			waits++
		}
	}
	if dispatches != want || waits != want-1 || rec.Fields[jobstate.FieldTry] != strconv.Itoa(want) {
		t.Fatalf("%d dispatches and %d retry waits, try %q; want %d attempts; history %+v", dispatches, waits,
			rec.Fields[jobstate.FieldTry], want, rec.History)
	}
}

// A job failing once with a long backoff parks its retry wait — no live
// actor, no lock — comes back at its time and succeeds with its second
// attempt, each attempt received once, and its client hears one result.
func TestRetryPolicyLongBackoffParksAndSucceedsAtItsTime(t *testing.T) {
	t.Parallel()
	f := newFixture(t, parkRetries)
	results, stop := clientResults(t, f.env.NATS, f.subj.Result)
	defer stop()
	h := &flaky{fails: 1, seen: map[string][]string{}}
	rec := newReceipts()
	f.startWorker("w-flaky", true, rec, h.handle)
	f.submit(longRetryReq("job-retry-park-1", 3*time.Second))
	parked := f.waitRetryParked(f.node, "job-retry-park-1")
	at := parked.Fields[jobstate.FieldRetryAt]

	r := f.waitStateWithin("job-retry-park-1", jobstate.StateSucceeded, 20*time.Second)
	attemptsOf(t, r, 2)
	var dispatched time.Time
	for _, hop := range r.History {
		if hop.To == jobstate.StateDispatched {
			dispatched = hop.At
		}
	}
	if ms, _ := strconv.ParseInt(at, 10, 64); dispatched.UnixMilli() < ms {
		t.Fatalf("attempt 2 dispatched at %v, before its retry time %v", dispatched, time.UnixMilli(ms))
	}
	h.mu.Lock()
	seen, bad := strings.Join(h.seen["job-retry-park-1"], ","), h.bad
	h.mu.Unlock()
	if seen != "job-retry-park-1~a1,job-retry-park-1~a2" || len(bad) > 0 {
		t.Fatalf("attempts at the worker: %s; mismatched numbers: %v", seen, bad)
	}
	for _, id := range []string{"job-retry-park-1~a1", "job-retry-park-1~a2"} {
		if n := rec.count(id); n != 1 {
			t.Fatalf("%s received %d times", id, n)
		}
	}
	if res := <-results; res.JobId != "job-retry-park-1" || res.Status != capv1.JobStatus_JOB_STATUS_SUCCEEDED {
		t.Fatalf("the client heard %+v", res)
	}
	// Its return is no adoption: the orphan counter stays at 0.
	if got := counter(t, f.node, "troupe_orphan_replayed_total", "job.echo"); got != 0 {
		t.Fatalf("a parked retry's return counted as %v orphans", got)
	}
	select {
	case extra := <-results:
		t.Fatalf("the client heard a second result: %+v", extra)
	case <-time.After(100 * time.Millisecond):
	}
}

// The node that parked the retry wait stops; another node's due poller
// brings the job back at its time, and attempt 2 runs there, once.
func TestRetryPolicyLongBackoffParkedWaitComesBackOnAnotherNode(t *testing.T) {
	t.Parallel()
	f := newFixture(t, parkRetries)
	h := &flaky{fails: 1, seen: map[string][]string{}}
	rec := newReceipts()
	f.startWorker("w-flaky", true, rec, h.handle)
	f.submit(longRetryReq("job-retry-park-2", 8*time.Second))
	f.waitRetryParked(f.node, "job-retry-park-2")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.node.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	keys := store.NewKeys(f.env.KeyPrefix())
	if s := f.env.Redis.HGet(context.Background(), keys.Job("job-retry-park-2"), "s").Val(); s != string(jobstate.StateScheduled) {
		t.Fatalf("state %s once node-a stopped, want the retry wait still on", s)
	}
	newNodeOn(t, f, "node-b", parkRetries)
	r := f.waitStateWithin("job-retry-park-2", jobstate.StateSucceeded, 30*time.Second)
	attemptsOf(t, r, 2)
	var lastDispatch string
	for _, hop := range r.History {
		if hop.To == jobstate.StateDispatched {
			lastDispatch = hop.Node
		}
	}
	if lastDispatch != "node-b" {
		t.Fatalf("attempt 2 dispatched by %q, want node-b; history %+v", lastDispatch, r.History)
	}
	for _, id := range []string{"job-retry-park-2~a1", "job-retry-park-2~a2"} {
		if n := rec.count(id); n != 1 {
			t.Fatalf("%s received %d times", id, n)
		}
	}
}

// An operator's cancel during a parked retry wait ends the job CANCELLED,
// its client hears that one result, and attempt 2 never runs.
func TestRetryPolicyParkedWaitIsCancelled(t *testing.T) {
	t.Parallel()
	f := newFixture(t, parkRetries)
	results, stop := clientResults(t, f.env.NATS, f.subj.Result)
	defer stop()
	h := &flaky{fails: 1, seen: map[string][]string{}}
	f.startWorker("w-flaky", true, nil, h.handle)
	f.submit(longRetryReq("job-retry-park-3", 10*time.Second))
	f.waitRetryParked(f.node, "job-retry-park-3")
	if err := f.node.Cancel(context.Background(), "job-retry-park-3", "changed my mind", "tester"); err != nil {
		t.Fatal(err)
	}
	r := f.waitState("job-retry-park-3", jobstate.StateCancelled)
	if r.Reason != jobstate.ReasonCancelRequested || r.LockHolder != "" {
		t.Fatalf("reason %s lock %q", r.Reason, r.LockHolder)
	}
	res := <-results
	if res.JobId != "job-retry-park-3" || res.Status != capv1.JobStatus_JOB_STATUS_CANCELLED {
		t.Fatalf("the client heard %+v", res)
	}
	select {
	case extra := <-results:
		t.Fatalf("the client heard a second result: %+v", extra)
	case <-time.After(200 * time.Millisecond):
	}
	h.mu.Lock()
	seen := strings.Join(h.seen["job-retry-park-3"], ",")
	h.mu.Unlock()
	if seen != "job-retry-park-3~a1" {
		t.Fatalf("attempts at the worker: %s", seen)
	}
}

// TestRetryPolicyParkHold measures, on demand (TROUPE_RETRY_PARK_HOLD=<jobs>;
// BENCHMARKS.md, "Retries"), what jobs waiting out a long retry backoff
// (10 min) hold on their node, with their waits kept live (RetryParkMin
// −1, the node before parking) and parked (the default), alternated
// TROUPE_RETRY_PARK_PAIRS times (default 1): live actors, locks held,
// lock renewals over one renewal interval (LockTTL/3, 20 s), and the Go
// heap's live bytes after a GC (the node runs in the test's process).
func TestRetryPolicyParkHold(t *testing.T) {
	jobs, _ := strconv.Atoi(os.Getenv("TROUPE_RETRY_PARK_HOLD"))
	if jobs <= 0 {
		t.Skip("set TROUPE_RETRY_PARK_HOLD=<jobs> to measure what long retry waits hold")
	}
	pairs, _ := strconv.Atoi(os.Getenv("TROUPE_RETRY_PARK_PAIRS"))
	for i := 0; i < max(pairs, 1); i++ {
		for _, mode := range []string{"kept", "parked"} {
			t.Run(mode, func(t *testing.T) { retryParkHold(t, jobs, mode == "parked") })
		}
	}
}

func retryParkHold(t *testing.T, jobs int, park bool) {
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.RetryParkMin = -1
		if park {
			c.Tuning.RetryParkMin = 0 // the default
		}
	})
	h := &flaky{fails: 1, seen: map[string][]string{}}
	for i := 0; i < 4; i++ {
		f.startWorker("w-flaky-"+strconv.Itoa(i), true, nil, h.handle)
	}
	f.waitWorkers(4)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	for i := 0; i < jobs; i++ {
		f.submit(longRetryReq("job-hold-"+strconv.Itoa(i), 10*time.Minute))
	}
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Minute)
	want := 0
	if !park {
		want = jobs
	}
	for {
		n, err := f.node.Store().CountStates(ctx, jobstate.StateScheduled)
		live, _ := f.node.LiveJobActors()
		h.mu.Lock()
		failed := len(h.seen)
		h.mu.Unlock()
		if err == nil && failed == jobs && n[jobstate.StateScheduled] == int64(jobs) && live == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v SCHEDULED, %d actors live after 10 min", n, live)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waited := time.Since(start)
	renewed := counter(t, f.node, "troupe_lock_renewals_total", "renewed")
	time.Sleep(21 * time.Second)
	renewed = counter(t, f.node, "troupe_lock_renewals_total", "renewed") - renewed
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	live, _ := f.node.LiveJobActors()
	keys := store.NewKeys(f.env.KeyPrefix())
	pipe := f.env.Redis.Pipeline()
	exists := make([]*redis.IntCmd, jobs)
	for i := range exists {
		exists[i] = pipe.Exists(ctx, keys.Lock("job-hold-"+strconv.Itoa(i)))
	}
	_, _ = pipe.Exec(ctx)
	locks := 0
	for _, c := range exists {
		locks += int(c.Val())
	}
	t.Logf("retry park hold (parked %v): %d jobs in retry_wait after %s; %d actors live, %d lock keys, %v locks held, %v renewals in 21 s; heap %.1f MiB live (%.1f MiB before the jobs, %+.0f B a job)",
		park, jobs, waited.Round(time.Millisecond), live, locks, counter(t, f.node, "troupe_job_locks_held", ""), renewed,
		float64(after.HeapAlloc)/(1<<20), float64(before.HeapAlloc)/(1<<20),
		(float64(after.HeapAlloc)-float64(before.HeapAlloc))/float64(jobs))
}
