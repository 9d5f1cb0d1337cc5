package admin_test

import (
	"context"
	"strings"
	"testing"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/ratelimit"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The routing plus one concurrency key and one rate-limit bucket.
const limitPools = testPools + `
concurrency_keys:
  "user-42": {limit: 1, strategy: queue}
rate_limits:
  api-ui:
    limit: 1
    per: 1h
`

func withMetaLabel(id, label, value string) *capv1.JobRequest {
	req := echoReq(id, "acme")
	req.Meta = &capv1.JobMetadata{Labels: map[string]string{label: value}}
	return req
}

// The Limits panel lists a concurrency key with its limit, strategy,
// holder and waiter, and a rate-limit bucket with its level, its rate and
// this node's waiting job.
func TestConcurrencyKeyDashboardShowsKeysAndRateLimitBuckets(t *testing.T) {
	bin := findChromium()
	if bin == "" {
		t.Skip("chromium is not installed (Debian: apt-get install chromium; or set TROUPE_CHROMIUM): dashboard not tested")
	}
	t.Parallel()
	pools, err := troupe.ParsePools([]byte(limitPools))
	if err != nil {
		t.Fatal(err)
	}
	// A node id of its own: the admin server finds the node's rate
	// limiter by node id in a registry per process, where the other
	// tests' nodes (all node-a) register theirs.
	b := setup(t, options{node: func(c *troupe.Config) { c.Pools, c.NodeID = pools, "node-limits-ui" }})
	b.startWorker("w-limits", hang)
	ctx := context.Background()
	c := b.client("")
	for _, req := range []*capv1.JobRequest{
		withMetaLabel("key-1", lifecycle.LabelConcurrencyKey, "user-42"), withMetaLabel("rate-1", ratelimit.LabelBucket, "api-ui"),
	} {
		if _, err := c.Submit(ctx, req); err != nil {
			t.Fatal(err)
		}
		b.waitState(c, req.JobId, "DISPATCHED")
	}
	for _, req := range []*capv1.JobRequest{
		withMetaLabel("key-2", lifecycle.LabelConcurrencyKey, "user-42"), withMetaLabel("rate-2", ratelimit.LabelBucket, "api-ui"),
	} {
		if _, err := c.Submit(ctx, req); err != nil {
			t.Fatal(err)
		}
		b.waitState(c, req.JobId, "SCHEDULED")
	}

	br := startBrowser(t, bin)
	br.navigate(t, b.base+"/ui/")
	key := br.waitFor(t, "the concurrency key", `(() => { const r = document.querySelector('#keys tr[data-key="user-42"]');
		return r && r.querySelector("td.holders").textContent === "1" && r.querySelector("td.waiters").textContent === "1" &&
			r.dataset.full === "true" && r.textContent; })()`, pageWait)
	for _, want := range []string{"user-42", "1queue"} {
		if !strings.Contains(key, want) {
			t.Errorf("the key's row says %q, want %q in it", key, want)
		}
	}
	bucket := br.waitFor(t, "the rate-limit bucket", `(() => { const r = document.querySelector('#buckets tr[data-bucket="api-ui"]');
		return r && r.querySelector("span.queued").textContent === "1" && r.textContent; })()`, pageWait)
	for _, want := range []string{"0 / 1", "1 per 1h", "rate-2"} {
		if !strings.Contains(bucket, want) {
			t.Errorf("the bucket's row says %q, want %q in it", bucket, want)
		}
	}
	if errs := br.pageErrors(); len(errs) > 0 {
		t.Errorf("the page logged errors: %v", errs)
	}
}

// A node with no concurrency keys or rate limits declared shows an empty
// state in both tables, not an error.
func TestRateLimitDashboardSaysWhenNoneAreDeclared(t *testing.T) {
	bin := findChromium()
	if bin == "" {
		t.Skip("chromium is not installed (Debian: apt-get install chromium; or set TROUPE_CHROMIUM): dashboard not tested")
	}
	t.Parallel()
	b := setup(t, options{})
	br := startBrowser(t, bin)
	br.navigate(t, b.base+"/ui/")
	br.waitFor(t, "the empty states", `document.body.dataset.loaded === "true" &&
		document.querySelector("#keys tbody").textContent.includes("no concurrency_keys declared") &&
		document.querySelector("#buckets tbody").textContent.includes("no rate_limits declared")`, pageWait)
	if errs := br.pageErrors(); len(errs) > 0 {
		t.Errorf("the page logged errors: %v", errs)
	}
	if s := br.waitFor(t, "the status line", `document.getElementById("status").textContent`, pageWait); !strings.HasPrefix(s, "updated") {
		t.Errorf("the status line says %q, want no error", s)
	}
}
