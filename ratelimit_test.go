package troupe_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/ratelimit"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// rateFixture is a node whose pools.yaml declares bucket "api": burst
// tokens, limit a period.
func rateFixture(t *testing.T, limit, burst int, per string, opts ...func(*troupe.Config)) *fixture {
	t.Helper()
	return newFixture(t, func(c *troupe.Config) {
		ratePools(t, limit, burst, per)(c)
		c.NodeID = rateNodeID(t)
		for _, o := range opts {
			o(c)
		}
	})
}

// ratePools is rateFixture's pools file for another node of the test.
func ratePools(t *testing.T, limit, burst int, per string) func(*troupe.Config) {
	return func(c *troupe.Config) {
		p, err := troupe.ParsePools([]byte(testPools + fmt.Sprintf(`
rate_limits:
  api:
    limit: %d
    burst: %d
    per: %s
`, limit, burst, per)))
		if err != nil {
			t.Fatal(err)
		}
		c.Pools = p
	}
}

// rateNodeID is a rate-limit test's own node id: the node's limiter is
// found by node id in a process-wide registry (ratelimit.Lookup), which
// parallel tests' nodes named alike would overwrite.
func rateNodeID(t *testing.T) string {
	h := fnv.New32a()
	h.Write([]byte(t.Name()))
	return fmt.Sprintf("node-rate-%08x", h.Sum32())
}

func rateReq(id string) *capv1.JobRequest {
	r := echoReq(id)
	r.Meta = &capv1.JobMetadata{Labels: map[string]string{ratelimit.LabelBucket: "api"}}
	return r
}

func echoWorker(f *fixture, rec *receipts) {
	f.startWorker("w-rate", true, rec, worker.Echo)
}

func hasHop(h []store.HistoryEntry, to jobstate.State, reason jobstate.Reason) bool {
	for _, e := range h {
		if e.To == to && e.Reason == reason {
			return true
		}
	}
	return false
}

func TestRateLimitWaitingJobsAreWokenInOrderAsTokensRefill(t *testing.T) {
	t.Parallel()
	// One token every 10 s, none saved up: the first job takes the token
	// (the test waits for its dispatch, so it is the one that has it: two
	// jobs submitted back to back may reach the limiter in either order),
	// each later one is queued behind the one before it (each is submitted
	// once the one before is recorded waiting) and woken by a refill.
	f := rateFixture(t, 1, 1, "10s")
	rec := newReceipts()
	echoWorker(f, rec)
	const n = 3
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("rate-order-%d", i))
	}
	f.submit(rateReq(ids[0]))
	nextDispatch := func(i int, want string) {
		t.Helper()
		select {
		case got := <-rec.ch:
			if got != want {
				t.Fatalf("dispatch %d was %s, want %s (arrival order)", i, got, want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("dispatch %d never came", i)
		}
	}
	nextDispatch(0, ids[0])
	for _, id := range ids[1:] {
		f.submit(rateReq(id))
		f.waitWaited(id)
	}
	for i, want := range ids[1:] {
		nextDispatch(i+1, want)
	}
	for _, id := range ids {
		f.waitState(id, jobstate.StateSucceeded)
	}
}

// waitWaited waits until job id's record shows its wait for tokens:
// SCHEDULED rate_limited in its history, the bucket on its record.
func (f *fixture) waitWaited(id string) {
	f.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		r, err := f.node.Record(context.Background(), id)
		if err == nil && hasHop(r.History, jobstate.StateScheduled, jobstate.ReasonRateLimited) {
			if r.Fields["rate_bucket"] != "api" || r.Fields["rate_units"] != "1" {
				f.t.Fatalf("%s waits with bucket %q, units %q", id, r.Fields["rate_bucket"], r.Fields["rate_units"])
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.t.Fatalf("%s never recorded a wait for tokens", id)
}

// parkSoon parks a job waiting for tokens 50 ms into its wait.
func parkSoon(c *troupe.Config) { c.Tuning.ParkAfter = 50 * time.Millisecond }

func TestRateLimitWaitingJobIsCancellableAndLeavesTheQueue(t *testing.T) {
	t.Parallel()
	f := rateFixture(t, 1, 1, "24h", parkSoon) // one token, no refill in the test's life
	rec := newReceipts()
	echoWorker(f, rec)
	f.submit(rateReq("rate-first"))
	f.waitState("rate-first", jobstate.StateSucceeded)
	f.submit(rateReq("rate-second"))
	f.waitWaited("rate-second")
	waitParked(t, f.node, 1) // the cancel reaches a parked waiter
	l := ratelimit.Lookup(rateNodeID(t))
	if l == nil {
		t.Fatal("no rate limiter registered for the test's node")
	}
	if p := l.Position("rate-second", "api"); p != 1 {
		t.Fatalf("rate-second's place in the bucket's queue: %d, want 1", p)
	}
	if err := f.node.Cancel(context.Background(), "rate-second", "not needed", "test"); err != nil {
		t.Fatal(err)
	}
	f.waitState("rate-second", jobstate.StateCancelled)
	deadline := time.Now().Add(10 * time.Second)
	for l.Position("rate-second", "api") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a cancelled job is still queued for tokens")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rec.count("rate-second") != 0 {
		t.Fatal("the cancelled job reached a worker")
	}
}

func TestRateLimitJobWaitingPastItsDeadlineFailsNamingTheBucket(t *testing.T) {
	t.Parallel()
	// It parks 50 ms into its wait: the deadline comes through the node's
	// parked set, due at it.
	f := rateFixture(t, 1, 1, "24h", parkSoon)
	echoWorker(f, nil)
	f.submit(rateReq("rate-take"))
	f.waitState("rate-take", jobstate.StateSucceeded)
	r := rateReq("rate-late")
	r.Budget = &capv1.Budget{DeadlineMs: 3000}
	f.submit(r)
	waitCounter(t, f.node, "troupe_jobs_parked_total", "", 1)
	rec := f.waitStateWithin("rate-late", jobstate.StateFailed, 30*time.Second)
	if got := counter(t, f.node, "troupe_jobs_parked_total", ""); got < 1 {
		t.Fatalf("the waiting job never parked (parked %v)", got)
	}
	if rec.Reason != jobstate.ReasonDeadlineExceeded {
		t.Fatalf("reason %s, want %s", rec.Reason, jobstate.ReasonDeadlineExceeded)
	}
	f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == "rate-late" })
}

func TestRateLimitUndeclaredBucketIsDeadLettered(t *testing.T) {
	t.Parallel()
	f := rateFixture(t, 10, 10, "1s")
	r := echoReq("rate-nobucket")
	r.Meta = &capv1.JobMetadata{Labels: map[string]string{ratelimit.LabelBucket: "nope"}}
	f.submit(r)
	rec := f.waitState("rate-nobucket", jobstate.StateFailed)
	if rec.Reason != jobstate.ReasonRateLimitInvalid {
		t.Fatalf("reason %s, want %s", rec.Reason, jobstate.ReasonRateLimitInvalid)
	}
	f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == "rate-nobucket" })
}

// A job waiting for tokens parks (after ParkAfter): no live actor, its lock held through the
// node lease (…|p, no TTL), so nothing renews it while it waits — and it
// keeps its place in the limiter's queue.
func TestRateLimitParkedWaiterIsNotRenewed(t *testing.T) {
	t.Parallel()
	f := rateFixture(t, 1, 1, "24h", parkSoon, func(c *troupe.Config) {
		c.Tuning.LockTTL = 1500 * time.Millisecond // a renewal round every 0.5 s
	})
	echoWorker(f, nil)
	f.submit(rateReq("rate-take"))
	f.waitState("rate-take", jobstate.StateSucceeded)
	f.submit(rateReq("rate-parked"))
	f.waitWaited("rate-parked")
	waitParked(t, f.node, 1)
	ctx := context.Background()
	key := store.NewKeys(f.env.KeyPrefix()).Lock("rate-parked")
	if lock := f.env.Redis.Get(ctx, key).Val(); !strings.HasSuffix(lock, "|p") {
		t.Fatalf("lock of the waiting job %q, want a parked one (…|p)", lock)
	}
	if ttl := f.env.Redis.PTTL(ctx, key).Val(); ttl != -1 {
		t.Fatalf("parked lock's TTL %v, want none", ttl)
	}
	if held := counter(t, f.node, "troupe_job_locks_held", ""); held != 0 {
		t.Fatalf("%v job locks held for renewal while the job waits parked", held)
	}
	l := ratelimit.Lookup(rateNodeID(t))
	if p := l.Position("rate-parked", "api"); p != 1 {
		t.Fatalf("the parked job's place in the queue: %d, want 1", p)
	}
	// Three of the node's lease renewals (the renewer's rounds) pass with
	// no lock renewal: the waiting job costs no Redis command.
	before := f.node.RenewStats()
	deadline := time.Now().Add(20 * time.Second)
	for f.node.RenewStats().LeaseRenewed < before.LeaseRenewed+3 {
		if time.Now().After(deadline) {
			t.Fatal("the node lease was not renewed three times")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if after := f.node.RenewStats(); after.Renewed != before.Renewed || after.Refused != before.Refused {
		t.Fatalf("lock renewals while the job waited parked: %d renewed, %d refused",
			after.Renewed-before.Renewed, after.Refused-before.Refused)
	}
	if r, _ := f.node.Record(ctx, "rate-parked"); r.State != jobstate.StateScheduled {
		t.Fatalf("the parked waiter is %s", r.State)
	}
}

// The limiter's grant wakes a parked waiter: a fresh actor activates it
// with the grant in hand and dispatches it; the units are taken once.
func TestRateLimitGrantWakesParkedWaiter(t *testing.T) {
	t.Parallel()
	f := rateFixture(t, 1, 1, "4s", parkSoon)
	rec := newReceipts()
	echoWorker(f, rec)
	f.submit(rateReq("rate-wake-first"))
	f.waitState("rate-wake-first", jobstate.StateSucceeded)
	f.submit(rateReq("rate-wake"))
	f.waitWaited("rate-wake")
	parkedBefore := waitCounter(t, f.node, "troupe_jobs_parked_total", "", 1)
	f.waitStateWithin("rate-wake", jobstate.StateSucceeded, 30*time.Second)
	if n := rec.count("rate-wake"); n != 1 {
		t.Fatalf("the woken job reached its worker %d times", n)
	}
	if got := counter(t, f.node, "troupe_jobs_unparked_total", ""); got < 1 {
		t.Fatalf("unparked %v (parked %v): the grant did not wake the parked job", got, parkedBefore)
	}
	l := ratelimit.Lookup(rateNodeID(t))
	if p := l.Position("rate-wake", "api"); p != 0 {
		t.Fatalf("the woken job still queued at %d", p)
	}
	// Two jobs, two units: none taken twice, none given back to a third.
	if got := counter(t, f.node, "troupe_rate_limit_granted_units_total", "api"); got != 2 {
		t.Fatalf("units granted %v, want 2", got)
	}
}

// A job parked waiting for tokens on a node that stops is adopted by
// another replica, which asks its own limiter for the tokens again.
func TestRateLimitParkedWaiterIsAdoptedAndAsksAgain(t *testing.T) {
	t.Parallel()
	f := rateFixture(t, 1, 1, "24h", parkSoon, func(c *troupe.Config) {
		c.Tuning.LockTTL = time.Hour // adoption must not wait for it
	})
	echoWorker(f, nil)
	f.submit(rateReq("rate-adopt-take"))
	f.waitState("rate-adopt-take", jobstate.StateSucceeded)
	f.submit(rateReq("rate-adopt"))
	f.waitWaited("rate-adopt")
	waitParked(t, f.node, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.node.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	otherID := rateNodeID(t) + "-b"
	b := newNodeOn(t, f, otherID, parkSoon, ratePools(t, 1, 1, "24h"),
		func(c *troupe.Config) { c.Tuning.LockTTL = time.Hour })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if l := ratelimit.Lookup(otherID); l != nil && l.Position("rate-adopt", "api") == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the adopting node's limiter never queued the parked waiter")
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitParked(t, b, 1) // and it parks there in its turn
	if r, _ := b.Record(ctx, "rate-adopt"); r.State != jobstate.StateScheduled || r.LockHolder == "" ||
		!strings.HasPrefix(r.LockHolder, otherID+"|") {
		t.Fatalf("adopted waiter %s held by %q", r.State, r.LockHolder)
	}
}

// timedFlaky is a worker handler that fails each job's first attempt and
// lets the second succeed, and notes when each attempt reached it: the
// calls an external API behind the bucket would have had.
type timedFlaky struct {
	mu       sync.Mutex
	at       []time.Time
	attempts map[string][]string // job id → the ids its attempts came under
}

func (h *timedFlaky) handle(_ context.Context, req *capv1.JobRequest) *capv1.JobResult {
	id, _ := jobstate.SplitAttempt(req.JobId)
	h.mu.Lock()
	h.at = append(h.at, time.Now())
	h.attempts[id] = append(h.attempts[id], req.JobId)
	run := len(h.attempts[id])
	h.mu.Unlock()
	if run == 1 {
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED, ErrorCode: "upstream_429"}
	}
	return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: "mem://" + id}
}

// mostInAWindow is the most receipts in any window of length w starting
// at a receipt (at sorted).
func mostInAWindow(at []time.Time, w time.Duration) int {
	most := 0
	for i := range at {
		n := 0
		for j := i; j < len(at) && at[j].Sub(at[i]) < w; j++ {
			n++
		}
		most = max(most, n)
	}
	return most
}

// Every attempt of a rate-limited job takes its units before its dispatch,
// the retries of failed attempts included: 20 jobs under a limit of 5 a
// second (burst 2) whose workers fail every first attempt reach their
// workers 40 times, never more than the bucket allows in any second
// (burst + limit), all SUCCEEDED on attempt 2, and 40 units are granted.
// A retry that reused its first attempt's grant (issue 31's flow control)
// ran right after its 50 ms backoff: about twice the limit. Live: the
// waits keep their actors; parked: every wait parks 50 ms in, and the
// retries' grants wake them.
func TestRateLimitEveryRetryTakesItsTokens(t *testing.T) {
	t.Parallel()
	const (
		limit, burst = 5, 2
		jobs         = 20
	)
	for _, tc := range []struct {
		name string
		opt  func(*troupe.Config)
	}{
		{"Live", func(*troupe.Config) {}},
		{"Parked", parkSoon},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, func(c *troupe.Config) {
				p, err := troupe.ParsePools([]byte(testPools + fmt.Sprintf(`
retries:
  job.echo: {attempts: 2, backoff_min: 50ms, backoff_max: 50ms}
rate_limits:
  api:
    limit: %d
    burst: %d
    per: 1s
`, limit, burst)))
				if err != nil {
					t.Fatal(err)
				}
				c.Pools = p
				c.NodeID = rateNodeID(t)
				tc.opt(c)
			})
			h := &timedFlaky{attempts: map[string][]string{}}
			f.startWorker("w-rate-retry", true, nil, h.handle)
			for i := range jobs {
				f.submit(rateReq(fmt.Sprintf("rate-retry-%d", i)))
			}
			for i := range jobs {
				id := fmt.Sprintf("rate-retry-%d", i)
				rec := f.waitStateWithin(id, jobstate.StateSucceeded, time.Minute)
				if rec.Fields[jobstate.FieldTry] != "2" {
					t.Fatalf("%s succeeded on attempt %q, want 2", id, rec.Fields[jobstate.FieldTry])
				}
			}
			h.mu.Lock()
			at := slices.Clone(h.at)
			for id, a := range h.attempts {
				if strings.Join(a, ",") != id+"~a1,"+id+"~a2" {
					t.Errorf("%s reached its worker as %v", id, a)
				}
			}
			h.mu.Unlock()
			if len(at) != 2*jobs {
				t.Fatalf("%d receipts, want %d", len(at), 2*jobs)
			}
			slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
			most := mostInAWindow(at, time.Second)
			t.Logf("%d receipts over %v, at most %d in one second", len(at), at[len(at)-1].Sub(at[0]), most)
			if most > limit+burst {
				t.Fatalf("%d receipts in one second, the bucket allows %d (limit %d + burst %d); spread over %v",
					most, limit+burst, limit, burst, at[len(at)-1].Sub(at[0]))
			}
			if got := counter(t, f.node, "troupe_rate_limit_granted_units_total", "api"); got != 2*jobs {
				t.Fatalf("units granted %v, want %d (one a attempt)", got, 2*jobs)
			}
		})
	}
}
