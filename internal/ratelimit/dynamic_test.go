package ratelimit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// tenantReq is a job of tenant naming bucket (labels beside).
func tenantReq(tenant, bucket string, labels ...string) *capv1.JobRequest {
	l := map[string]string{LabelBucket: bucket}
	for i := 0; i+1 < len(labels); i += 2 {
		l[labels[i]] = labels[i+1]
	}
	return &capv1.JobRequest{Topic: "job.x", TenantId: tenant, Meta: &capv1.JobMetadata{Labels: l}}
}

func mustParse(t *testing.T, yaml string) *Spec {
	t.Helper()
	s, err := Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A template's name expands per job: {tenant} to the job's tenant,
// {label:NAME} to its label's value; a plain bucket of a key's name wins
// over the template; a job naming one key's bucket takes from it; bad
// placeholders, max_keys on a plain bucket and two templates that could
// name the same bucket are refused naming their line.
func TestRateLimitTemplateSpecExpandsPerKey(t *testing.T) {
	s := mustParse(t, `
rate_limits:
  "openai:{tenant}": {limit: 5, topics: [job.sum], max_keys: 3}
  "model:{label:model}": {limit: 2}
  "openai:vip": {limit: 50}
`)
	for _, c := range []struct {
		req  *capv1.JobRequest
		want string
	}{
		{tenantReq("acme", "openai:{tenant}"), "openai:acme"},
		{tenantReq("", "openai:{tenant}"), "openai:default"},
		{&capv1.JobRequest{Topic: "job.sum", TenantId: "beta"}, "openai:beta"},
		{tenantReq("vip", "openai:{tenant}"), "openai:vip"},
		{tenantReq("acme", "model:{label:model}", "model", "gpt"), "model:gpt"},
		{tenantReq("acme", "model:{label:model}"), "model:"},
		{tenantReq("acme", "openai:zeta"), "openai:zeta"},
	} {
		got, units, problem := s.ForJob(c.req)
		if got != c.want || units != 1 || problem != "" {
			t.Fatalf("%v: bucket %q units %d problem %q, want %q", c.req.GetMeta().GetLabels(), got, units, problem, c.want)
		}
	}
	if b := s.Resolve("openai:acme"); b == nil || b.Of != "openai:{tenant}" || b.Rate != 5 || b.MaxKeys != 3 {
		t.Fatalf("resolve openai:acme: %+v", b)
	}
	if b := s.Resolve("openai:vip"); b == nil || b.Of != "" || b.Rate != 50 {
		t.Fatalf("resolve openai:vip (declared): %+v", b)
	}
	if b := s.Resolve("model:gpt"); b == nil || b.MaxKeys != MaxKeysDefault {
		t.Fatalf("resolve model:gpt: %+v", b)
	}
	if _, _, p := s.ForJob(tenantReq("a b", "openai:{tenant}")); p == "" {
		t.Fatal("a tenant with a space made a bucket name")
	}
	for _, bad := range []string{
		"rate_limits:\n  \"a:{user}\": {limit: 1}\n",
		"rate_limits:\n  \"a:{tenant}:{tenant}\": {limit: 1}\n",
		"rate_limits:\n  \"a:{label:}\": {limit: 1}\n",
		"rate_limits:\n  a: {limit: 1, max_keys: 5}\n",
		"rate_limits:\n  \"a:{tenant}\": {limit: 1, max_keys: 1000000}\n",
		"rate_limits:\n  \"a:{tenant}\": {limit: 1}\n  \"a:{label:x}\": {limit: 1}\n",
	} {
		if _, err := Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), "line") {
			t.Fatalf("%q: err %v, want one naming its line", bad, err)
		}
	}
}

// Merge is the union of two files' buckets: alike declarations are one,
// different ones and a topic bound twice are conflicts.
func TestRateLimitMergeOfPoolsAndPolicyBuckets(t *testing.T) {
	pools := mustParse(t, "rate_limits:\n  a: {limit: 1, topics: [job.a]}\n  b: {limit: 2}\n")
	policy := mustParse(t, "rate_limits:\n  b: {limit: 2}\n  \"c:{tenant}\": {limit: 3, topics: [job.c]}\n")
	m, err := Merge(pools, policy)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(m.Names(), ",") != "a,b" || m.Templates["c:{tenant}"] == nil {
		t.Fatalf("merged %v, templates %v", m.Names(), m.Templates)
	}
	if b, _, _ := m.ForJob(&capv1.JobRequest{Topic: "job.c", TenantId: "t"}); b != "c:t" {
		t.Fatalf("job.c takes from %q, want c:t", b)
	}
	if b, _, _ := m.ForJob(&capv1.JobRequest{Topic: "job.a"}); b != "a" {
		t.Fatalf("job.a takes from %q, want a", b)
	}
	if m, _ := Merge(pools, nil); m != pools {
		t.Fatal("a merge with no policy buckets is not the pools' own")
	}
	for _, bad := range []string{
		"rate_limits:\n  b: {limit: 3}\n",
		"rate_limits:\n  z: {limit: 3, topics: [job.a]}\n",
	} {
		if _, err := Merge(pools, mustParse(t, bad)); err == nil {
			t.Fatalf("merge with %q: no conflict", bad)
		}
	}
	for _, bad := range []string{
		"rate_limits:\n  \"c:{tenant}\": {limit: 4}\n",  // the template, declared differently
		"rate_limits:\n  \"c:{label:x}\": {limit: 3}\n", // another template naming c:... buckets
	} {
		if _, err := Merge(policy, mustParse(t, bad)); err == nil {
			t.Fatalf("merge of the policy's template with %q: no conflict", bad)
		}
	}
}

// Each key of a template gets its own bucket on first use, with the
// declared rate: one tenant's spent bucket does not hold another's job.
// Past max_keys live on the node, new keys share the overflow bucket; a
// key's bucket idle for the limiter's idle time is dropped (and made again
// on its next use, its Redis level carried over).
func TestRateLimitTemplateKeyBucketsAreBoundedAndDroppedIdle(t *testing.T) {
	r := newRig(t)
	s := mustParse(t, "rate_limits:\n  \"api:{tenant}\": {limit: 1, burst: 1, per: 24h, max_keys: 2}\n")
	l := New(Config{Spec: s, Store: r.st, NodeID: "n1", Idle: 200 * time.Millisecond})
	t.Cleanup(func() { _ = l.Stop(context.Background()) })
	_ = l.Start(context.Background())
	take := func(job, tenant string) (string, Answer) {
		b, units, problem := l.ForJob(tenantReq(tenant, "api:{tenant}"))
		if problem != "" {
			t.Fatal(problem)
		}
		return b, l.Take(job, b, units, 1, r.notify(job))
	}
	// Nothing is granted at once until a call has taken tokens: each key's
	// first job waits for its bucket's first call, then is granted.
	for _, c := range []struct{ job, tenant, bucket string }{{"a1", "a", "api:a"}, {"b1", "b", "api:b"}} {
		if b, ans := take(c.job, c.tenant); b != c.bucket || ans != Pending {
			t.Fatalf("%s: bucket %q answer %d, want %s Pending", c.job, b, ans, c.bucket)
		}
		if got := r.waitGrants(t, 1); got[0] != c.job {
			t.Fatalf("grant %v, want %s", got, c.job)
		}
	}
	if n := l.Keys("api:{tenant}"); n != 2 {
		t.Fatalf("%d key buckets live, want 2", n)
	}
	// Tenant a's bucket is spent for a day: its next job waits.
	if _, ans := take("a2", "a"); ans != Pending {
		t.Fatalf("a2: %d, want Pending", ans)
	}
	// A third key past max_keys 2: the overflow bucket.
	if b, _ := take("c1", "c"); b != "api:"+OverflowKey {
		t.Fatalf("c1 takes from %q, want the overflow bucket", b)
	}
	if got := r.waitGrants(t, 1); got[0] != "c1" {
		t.Fatalf("grant %v, want c1", got)
	}
	if got := value(l.m.Overflow.WithLabelValues("api:{tenant}")); got != 1 {
		t.Fatalf("overflow counted %v, want 1", got)
	}
	// b's and the overflow's buckets go idle and are dropped; a's holds a
	// waiter and stays.
	deadline := time.Now().Add(time.Minute)
	for l.Keys("api:{tenant}") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("idle key buckets not dropped: %d live", l.Keys("api:{tenant}"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if p := l.Position("a2", "api:a"); p != 1 {
		t.Fatalf("a2's place %d: the bucket with a waiter was dropped", p)
	}
	// b's bucket made again: its level (spent, a day to refill) carried
	// over in Redis, so its next job is told it waits after the call.
	b, _, _ := l.ForJob(tenantReq("b", "api:{tenant}"))
	told := make(chan bool, 1)
	if ans := l.Take("b2", b, 1, 1, func(granted bool, _ string) { told <- granted }); b != "api:b" || ans != Pending {
		t.Fatalf("b2: bucket %q answer %d, want api:b Pending", b, ans)
	}
	select {
	case granted := <-told:
		if granted {
			t.Fatal("b2 granted from a spent bucket made again")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("b2 never told after its bucket's call")
	}
}
