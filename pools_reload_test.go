package troupe_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// poolsFileFixture is a node reading its pools from a file (so a reload
// re-reads it); rewrite changes the file and reloads it as SIGHUP does.
func poolsFileFixture(t *testing.T, yaml string) (*fixture, func(string)) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pools.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *troupe.Config) {
		c.Pools, c.PoolsFile, c.NodeID = nil, path, rateNodeID(t)
	})
	return f, func(yaml string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := f.node.ReloadPools(); err != nil {
			t.Fatalf("reload: %v", err)
		}
	}
}

const rateAPI24h = testPools + `
rate_limits:
  api: {limit: 1, burst: 1, per: 24h}
`

// A job waiting on bucket api (one token a day, spent) is dispatched once
// a reload raises the limit: the bucket's level carries over, and the new
// rate refills it.
func TestRateLimitReloadRaisedLimitDispatchesTheWaitingJob(t *testing.T) {
	t.Parallel()
	f, rewrite := poolsFileFixture(t, rateAPI24h)
	echoWorker(f, nil)
	f.submit(rateReq("rate-first"))
	f.waitState("rate-first", jobstate.StateSucceeded)
	f.submit(rateReq("rate-waits"))
	f.waitWaited("rate-waits")
	rewrite(testPools + `
rate_limits:
  api: {limit: 50, burst: 1, per: 1s}
`)
	f.waitState("rate-waits", jobstate.StateSucceeded)
}

// A reload that removes the bucket a job waits on fails the job
// rate_limit_invalid, dead-lettered, naming the bucket; a job submitted
// after it naming the bucket fails so too, and the kept bucket grants.
func TestRateLimitReloadRemovedBucketFailsItsWaitingJobs(t *testing.T) {
	t.Parallel()
	f, rewrite := poolsFileFixture(t, rateAPI24h)
	echoWorker(f, nil)
	f.submit(rateReq("rate-first"))
	f.waitState("rate-first", jobstate.StateSucceeded)
	f.submit(rateReq("rate-waits"))
	f.waitWaited("rate-waits")
	rewrite(testPools + `
rate_limits:
  other: {limit: 10}
`)
	rec := f.waitState("rate-waits", jobstate.StateFailed)
	if rec.Reason != jobstate.ReasonRateLimitInvalid || !strings.Contains(rec.Fields["error_message"], `"api"`) {
		t.Fatalf("reason %s, message %q; want %s naming bucket api", rec.Reason, rec.Fields["error_message"],
			jobstate.ReasonRateLimitInvalid)
	}
	f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == "rate-waits" })
	f.submit(rateReq("rate-after"))
	if rec := f.waitState("rate-after", jobstate.StateFailed); rec.Reason != jobstate.ReasonRateLimitInvalid {
		t.Fatalf("a job naming the removed bucket: reason %s", rec.Reason)
	}
}

// An invalid rate_limits section rejects the whole file: the buckets in
// force stay, and ReloadPools names the line.
func TestRateLimitReloadInvalidSectionKeepsTheBuckets(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "pools.yaml")
	if err := os.WriteFile(path, []byte(rateAPI24h), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *troupe.Config) { c.Pools, c.PoolsFile, c.NodeID = nil, path, rateNodeID(t) })
	echoWorker(f, nil)
	bad := testPools + "rate_limits:\n  api: {limit: 0}\n"
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.node.ReloadPools(); err == nil || !strings.Contains(err.Error(), "line") {
		t.Fatalf("reload of an invalid rate_limits section: %v, want an error naming the line", err)
	}
	f.submit(rateReq("rate-first"))
	f.waitState("rate-first", jobstate.StateSucceeded)
	f.submit(rateReq("rate-waits"))
	f.waitWaited("rate-waits") // still one token a day
}

// A reload's retry policy applies to jobs that start after it: a job of a
// topic with none fails at its first failure; after the reload gives the
// topic 3 attempts, the next job is retried and succeeds.
func TestRetryPolicyReloadAppliesToJobsStartedLater(t *testing.T) {
	t.Parallel()
	f, rewrite := poolsFileFixture(t, testPools)
	h := &flaky{fails: 1, seen: map[string][]string{}}
	f.startWorker("w-flaky", true, nil, h.handle)
	f.submit(echoReq("job-retry-before"))
	if rec := f.waitState("job-retry-before", jobstate.StateFailed); rec.Fields[jobstate.FieldTry] != "" {
		t.Fatalf("a job with no policy was tried %q times", rec.Fields[jobstate.FieldTry])
	}
	rewrite(testPools + `
retries:
  job.echo: {attempts: 3, backoff_min: 50ms, backoff_max: 100ms}
`)
	f.submit(echoReq("job-retry-after"))
	rec := f.waitState("job-retry-after", jobstate.StateSucceeded)
	h.mu.Lock()
	seen := h.seen["job-retry-after"]
	h.mu.Unlock()
	if strings.Join(seen, ",") != "job-retry-after~a1,job-retry-after~a2" || rec.Fields[jobstate.FieldTry] != "2" {
		t.Fatalf("attempts %v, try %q; want two attempts under the reloaded policy", seen, rec.Fields[jobstate.FieldTry])
	}
	// Back to none: the next job runs once again.
	rewrite(testPools)
	f.submit(echoReq("job-retry-none"))
	f.waitState("job-retry-none", jobstate.StateFailed)
	h.mu.Lock()
	seen = h.seen["job-retry-none"]
	h.mu.Unlock()
	if strings.Join(seen, ",") != "job-retry-none" {
		t.Fatalf("attempts %v after the policy was removed, want one under the job's id", seen)
	}
}

// A reload that raises a concurrency key's limit lets its waiting job take
// a slot while the first still holds one (the key's recheck asks with the
// new limit); the key's slots stay in internal/keyslot, unchanged.
func TestConcurrencyKeyReloadRaisedLimitStartsTheWaitingJob(t *testing.T) {
	t.Parallel()
	f, rewrite := poolsFileFixture(t, testPools+"concurrency_keys:\n  solo: {limit: 1}\n")
	kc := newKeyCounter()
	release := make(chan struct{})
	defer close(release)
	f.startWorker("w1", true, nil, kc.handler(release))
	f.waitWorkers(1)
	f.submit(keyedReq("key-first", "solo"))
	<-kc.started
	f.submit(keyedReq("key-second", "solo"))
	if r := f.waitState("key-second", jobstate.StateScheduled); r.Reason != jobstate.ReasonConcurrencyKey {
		t.Fatalf("key-second waits with reason %s, want %s", r.Reason, jobstate.ReasonConcurrencyKey)
	}
	rewrite(testPools + "concurrency_keys:\n  solo: {limit: 2}\n")
	select {
	case id := <-kc.started:
		if id != "key-second" {
			t.Fatalf("started %s, want key-second", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("key-second never started under the raised limit")
	}
	if m := kc.maxOf("solo"); m != 2 {
		t.Fatalf("the worker held %d of key solo at once, want 2", m)
	}
	kn, ok := inspect.Of(f.node).(admin.KeyNode)
	if !ok {
		t.Fatal("the node's inspector serves no concurrency keys")
	}
	stats, on, err := kn.ConcurrencyKeys(context.Background(), 10)
	if err != nil || !on {
		t.Fatalf("concurrency keys listing: on %v, err %v", on, err)
	}
	for _, s := range stats {
		if s.Key == "solo" && s.Limit != 2 {
			t.Fatalf("the listing shows key solo's limit %d after the reload, want 2", s.Limit)
		}
	}
}
