package troupe_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/ratelimit"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// policyEngine is a built-in engine over a policy file holding yaml (no
// poll: rewrite changes the file and reloads it, as SIGHUP does, and
// returns Reload's error).
func policyEngine(t *testing.T, yaml string) (*safety.Engine, func(string) error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := safety.StartEngine(safety.EngineConfig{Path: path, Poll: -1, Log: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, func(yaml string) error {
		t.Helper()
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return e.Reload()
	}
}

const policyAPI24h = `
version: v1
rules:
  - id: all
    match: {topics: ["job.*"]}
    decision: allow
rate_limits:
  api: {limit: 1, burst: 1, per: 24h}
`

// A bucket declared in the policy file throttles as one in the pools file
// does; a policy reload that keeps the bucket and raises its rate grants
// the job parked on it (its ask stays in the limiter's queue through the
// reload: the grant reaches the parked job, no recheck needed).
func TestRateLimitFromPolicyFileParkedJobIsGrantedAfterAReloadKeepingTheBucket(t *testing.T) {
	t.Parallel()
	e, rewrite := policyEngine(t, policyAPI24h)
	f := newFixture(t, func(c *troupe.Config) {
		c.Policy, c.NodeID = e, rateNodeID(t)
		parkSoon(c)
	})
	echoWorker(f, nil)
	f.submit(rateReq("rate-pol-first"))
	f.waitState("rate-pol-first", jobstate.StateSucceeded)
	f.submit(rateReq("rate-pol-waits"))
	f.waitWaited("rate-pol-waits")
	waitParked(t, f.node, 1)
	if err := rewrite(strings.Replace(policyAPI24h, "{limit: 1, burst: 1, per: 24h}", "{limit: 50, burst: 1, per: 1s}", 1)); err != nil {
		t.Fatal(err)
	}
	f.waitStateWithin("rate-pol-waits", jobstate.StateSucceeded, 30*time.Second)
	l := ratelimit.Lookup(rateNodeID(t))
	if b := l.Spec().Buckets["api"]; b == nil || b.Rate != 50 {
		t.Fatalf("bucket api after the policy reload: %+v", b)
	}
	// A reload removing the section removes the bucket: labels are ignored.
	if err := rewrite("rules: []\n"); err != nil {
		t.Fatal(err)
	}
	if !l.Spec().Empty() {
		t.Fatalf("buckets after the section's removal: %v", l.Spec().Names())
	}
}

// The pools file and the policy file merge: each declares its own bucket,
// both apply; a bucket both declare differently is a load error — NewNode
// fails naming it, and a policy reload that would conflict is refused (the
// buckets in force stay).
func TestRateLimitFromPolicyConflictWithThePoolsFileIsALoadError(t *testing.T) {
	t.Parallel()
	e, _ := policyEngine(t, policyAPI24h)
	conflicting := func(c *troupe.Config) {
		p, err := troupe.ParsePools([]byte(testPools + "rate_limits:\n  api: {limit: 5}\n"))
		if err != nil {
			t.Fatal(err)
		}
		c.Pools, c.Policy = p, e
	}
	cfg := troupe.Config{NodeID: rateNodeID(t)}
	conflicting(&cfg)
	if _, err := troupe.NewNode(cfg); err == nil || !strings.Contains(err.Error(), `bucket "api"`) ||
		!strings.Contains(err.Error(), "conflict") {
		t.Fatalf("NewNode with conflicting buckets: %v", err)
	}
	e2, rewrite := policyEngine(t, "rate_limits:\n  other: {limit: 7}\n")
	f := newFixture(t, func(c *troupe.Config) {
		ratePools(t, 1, 1, "24h")(c)
		c.Policy, c.NodeID = e2, rateNodeID(t)+"-b"
	})
	l := ratelimit.Lookup(rateNodeID(t) + "-b")
	if got := strings.Join(l.Spec().Names(), ","); got != "api,other" {
		t.Fatalf("buckets in force %q, want api,other", got)
	}
	err := rewrite("rate_limits:\n  other: {limit: 8}\n  api: {limit: 9}\n")
	if err == nil || !strings.Contains(err.Error(), `bucket "api"`) {
		t.Fatalf("conflicting policy reload: %v", err)
	}
	if b := l.Spec().Buckets["other"]; b == nil || b.Rate != 7 {
		t.Fatalf("bucket other after a refused reload: %+v", b)
	}
	if e2.Policy().Limits() == nil || !strings.Contains(string(e2.Policy().Limits()), "limit: 7") {
		t.Fatal("the refused policy replaced the one in force")
	}
	_ = f
}

// A template in the policy file gives each tenant its own bucket: tenant
// a's spent bucket holds a's next job, not b's.
func TestRateLimitFromPolicyTemplateGivesEachTenantItsBucket(t *testing.T) {
	t.Parallel()
	e, _ := policyEngine(t, "rate_limits:\n  \"api:{tenant}\": {limit: 1, burst: 1, per: 24h, topics: [job.echo]}\n")
	f := newFixture(t, func(c *troupe.Config) { c.Policy, c.NodeID = e, rateNodeID(t) })
	echoWorker(f, nil)
	req := func(id, tenant string) *capv1.JobRequest {
		r := echoReq(id)
		r.TenantId = tenant
		return r
	}
	f.submit(req("rate-tpl-a1", "a"))
	f.waitState("rate-tpl-a1", jobstate.StateSucceeded)
	f.submit(req("rate-tpl-a2", "a"))
	f.submit(req("rate-tpl-b1", "b"))
	f.waitState("rate-tpl-b1", jobstate.StateSucceeded)
	r := f.waitState("rate-tpl-a2", jobstate.StateScheduled)
	if r.Reason != jobstate.ReasonRateLimited || r.Fields["rate_bucket"] != "api:a" {
		t.Fatalf("a2 %s %s bucket %q, want SCHEDULED rate_limited on api:a", r.State, r.Reason, r.Fields["rate_bucket"])
	}
	if n := ratelimit.Lookup(rateNodeID(t)).Keys("api:{tenant}"); n != 2 {
		t.Fatalf("%d key buckets live, want 2", n)
	}
}

// A concurrency key limit declared in the policy file holds (the node
// starts its slots for it, with no concurrency_keys in the pools file); a
// policy reload raising it starts the waiting job; a key both files
// declare differently is a load error.
func TestConcurrencyKeyFromPolicyFileLimitsAndReloads(t *testing.T) {
	t.Parallel()
	e, rewrite := policyEngine(t, "concurrency_keys:\n  solo: {limit: 1}\n")
	f := newFixture(t, func(c *troupe.Config) { c.Policy = e })
	kc := newKeyCounter()
	release := make(chan struct{})
	defer close(release)
	f.startWorker("w1", true, nil, kc.handler(release))
	f.waitWorkers(1)
	f.submit(keyedReq("key-pol-first", "solo"))
	<-kc.started
	f.submit(keyedReq("key-pol-second", "solo"))
	if r := f.waitState("key-pol-second", jobstate.StateScheduled); r.Reason != jobstate.ReasonConcurrencyKey {
		t.Fatalf("key-pol-second waits with reason %s, want %s", r.Reason, jobstate.ReasonConcurrencyKey)
	}
	if err := rewrite("concurrency_keys:\n  solo: {limit: 2}\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-kc.started:
		if id != "key-pol-second" {
			t.Fatalf("started %s, want key-pol-second", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("key-pol-second never started under the raised limit")
	}
	if m := kc.maxOf("solo"); m != 2 {
		t.Fatalf("the worker held %d of key solo at once, want 2", m)
	}
	cfg := troupe.Config{NodeID: "node-key-conflict", Pools: keyPools(t, "  solo: {limit: 3}\n"), Policy: e}
	if _, err := troupe.NewNode(cfg); err == nil || !strings.Contains(err.Error(), `key "solo"`) {
		t.Fatalf("NewNode with a key declared differently in both files: %v", err)
	}
}
