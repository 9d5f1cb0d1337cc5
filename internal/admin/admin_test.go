package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

func TestServerWithoutKeysListensOnLoopbackOnly(t *testing.T) {
	t.Parallel()
	var node admin.Node = inspect.Of((*troupe.Node)(nil)) // construction does not touch the node
	for _, addr := range []string{":7070", "0.0.0.0:7070", "[::]:7070", "10.1.2.3:7070", "admin.example.com:7070"} {
		_, err := admin.NewServer(admin.Config{Node: node, Registry: newRegistry(), Listen: addr})
		if !errors.Is(err, admin.ErrPublicWithoutKeys) {
			t.Errorf("listen %q without keys: err %v, want ErrPublicWithoutKeys", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0", "127.0.0.2:7070"} {
		if _, err := admin.NewServer(admin.Config{Node: node, Registry: newRegistry(), Listen: addr}); err != nil {
			t.Errorf("listen %q without keys: %v", addr, err)
		}
	}
	if _, err := admin.NewServer(admin.Config{Node: node, Registry: newRegistry(), Listen: "0.0.0.0:0",
		APIKeys: testKeys}); err != nil {
		t.Errorf("public listen with keys: %v", err)
	}
	if _, err := admin.NewServer(admin.Config{Node: node, Registry: newRegistry(), Listen: "0.0.0.0:0",
		APIKeys: map[string]string{"short": "*"}}); err == nil {
		t.Error("a key shorter than MinKeyLength was accepted")
	}
}

func TestKeysScopeEveryJobActionToTheirTenant(t *testing.T) {
	t.Parallel()
	b := setup(t, options{keys: testKeys, node: func(c *troupe.Config) { c.Policy = labelPolicy{} }})
	ctx := context.Background()
	all, ca, cb := b.client(keyAll), b.client(keyA), b.client(keyB)

	// Wrong or missing key: 401 everywhere, probes aside.
	for _, c := range []*admin.Client{b.client(""), b.client("not-a-key-of-this-server")} {
		if _, err := c.Job(ctx, "x"); apiStatus(err) != http.StatusUnauthorized {
			t.Fatalf("bad key: %v, want 401", err)
		}
		if _, err := c.Workers(ctx); apiStatus(err) != http.StatusUnauthorized {
			t.Fatalf("bad key on workers: %v, want 401", err)
		}
	}
	// X-API-Key works as well as a bearer token.
	req, _ := http.NewRequest(http.MethodGet, b.base+"/v1/whoami", nil)
	req.Header.Set("X-API-Key", keyB)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("X-API-Key: %v %v", res, err)
	}
	res.Body.Close()

	// Tenant b's job waits for approval, so every action on it is possible.
	jb := echoReq("job-of-b", "")
	jb.Labels = map[string]string{"cordum.policy": "approve"}
	sub, err := cb.Submit(ctx, jb)
	if err != nil || sub.Tenant != "b" {
		t.Fatalf("submit as b: %+v %v", sub, err)
	}
	b.waitState(cb, "job-of-b", "APPROVAL_REQUIRED")

	// Tenant a cannot see it or act on it: to a, it does not exist.
	if _, err := ca.Job(ctx, "job-of-b"); apiStatus(err) != http.StatusNotFound {
		t.Fatalf("a reads b's job: %v, want 404", err)
	}
	if _, err := ca.Trace(ctx, "job-of-b"); apiStatus(err) != http.StatusNotFound {
		t.Fatalf("a reads b's trace: %v, want 404", err)
	}
	for _, action := range []string{"approve", "reject"} {
		// a's key is a client's: refused for its role before the job is
		// looked up, so the answer says nothing about b's job.
		if _, err := ca.Decide(ctx, "job-of-b", action, "", "", ""); apiStatus(err) != http.StatusForbidden {
			t.Fatalf("a %ss b's job: %v, want 403", action, err)
		}
	}
	if _, err := ca.Cancel(ctx, "job-of-b", "", ""); apiStatus(err) != http.StatusNotFound {
		t.Fatalf("a cancels b's job: %v, want 404", err)
	}
	list, err := ca.ListJobs(ctx, "APPROVAL_REQUIRED", 0, "", "")
	if err != nil || len(list.Jobs) != 0 {
		t.Fatalf("a lists b's jobs: %+v %v", list, err)
	}
	if _, err := ca.ListJobs(ctx, "APPROVAL_REQUIRED", 0, "", "b"); apiStatus(err) != http.StatusForbidden {
		t.Fatalf("a lists tenant b explicitly: %v, want 403", err)
	}
	// a cannot submit as b, nor take b's job id.
	if _, err := ca.Submit(ctx, echoReq("job-sneaky", "b")); apiStatus(err) != http.StatusForbidden {
		t.Fatalf("a submits as b: %v, want 403", err)
	}
	if _, err := ca.Submit(ctx, echoReq("job-of-b", "")); apiStatus(err) != http.StatusConflict {
		t.Fatalf("a reuses b's job id: %v, want 409", err)
	}
	// Cluster-wide actions need an all-tenant key.
	if _, err := ca.SetPool(ctx, "job.other", []string{"echo"}); apiStatus(err) != http.StatusForbidden {
		t.Fatalf("a maps a topic: %v, want 403", err)
	}
	if _, err := ca.Stats(ctx); apiStatus(err) != http.StatusForbidden {
		t.Fatalf("a reads node stats: %v, want 403", err)
	}

	// b and the all-tenant key see it; b approves it.
	if l, err := cb.ListJobs(ctx, "APPROVAL_REQUIRED", 0, "", ""); err != nil || len(l.Jobs) != 1 || l.Jobs[0].ID != "job-of-b" {
		t.Fatalf("b lists its job: %+v %v", l, err)
	}
	if j, err := all.Job(ctx, "job-of-b"); err != nil || j.Tenant != "b" {
		t.Fatalf("all-tenant key reads b's job: %+v %v", j, err)
	}
	if _, err := cb.Decide(ctx, "job-of-b", "reject", "not today", "", ""); apiStatus(err) != http.StatusForbidden {
		t.Fatalf("b's client key rejects its job: %v, want 403 (approvals need an operator)", err)
	}
	if _, err := all.Decide(ctx, "job-of-b", "reject", "not today", "", ""); err != nil {
		t.Fatalf("the all-tenant (operator) key rejects b's job: %v", err)
	}
	j := b.waitState(cb, "job-of-b", "DENIED")
	var kinds []string
	for _, d := range j.Decisions {
		kinds = append(kinds, d.Kind+":"+d.Decision+":"+d.By)
	}
	if !slices.Contains(kinds, "policy:require_approval:") || !slices.ContainsFunc(kinds, func(k string) bool { return strings.HasPrefix(k, "approval:rejected:api:*/") }) {
		t.Fatalf("decisions %v", kinds)
	}

	// The DLQ entry of b's denied job is b's too.
	var seen bool
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !seen; time.Sleep(20 * time.Millisecond) {
		d, err := cb.DLQ(ctx, 50)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range d.Entries {
			if e.JobID == "job-of-b" && e.Tenant == "b" {
				seen = true
				if _, err := ca.RetryDLQ(ctx, e.ID, false); apiStatus(err) != http.StatusNotFound {
					t.Fatalf("a retries b's DLQ entry: %v, want 404", err)
				}
				if err := ca.DeleteDLQ(ctx, e.ID); apiStatus(err) != http.StatusNotFound {
					t.Fatalf("a deletes b's DLQ entry: %v, want 404", err)
				}
			}
		}
	}
	if !seen {
		t.Fatal("b never saw its DLQ entry")
	}
	if d, err := ca.DLQ(ctx, 50); err != nil || len(d.Entries) != 0 {
		t.Fatalf("a sees DLQ entries of b: %+v %v", d, err)
	}
}

func TestJobLifecycleThroughTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, options{node: func(c *troupe.Config) { c.Policy = labelPolicy{} }})
	ctx := context.Background()
	c := b.client("")
	b.startWorker("w1", worker.Echo)

	// Submit without an id: the server names the job.
	sub, err := c.Submit(ctx, &capv1.JobRequest{Topic: "job.echo", ContextPtr: "redis://ctx:auto"})
	if err != nil || !strings.HasPrefix(sub.JobID, "job-") || sub.Duplicate {
		t.Fatalf("submit: %+v %v", sub, err)
	}
	j := b.waitState(c, sub.JobID, "SUCCEEDED")
	var path []string
	for _, h := range j.History {
		path = append(path, h.To)
	}
	var req map[string]any
	_ = json.Unmarshal(j.Request, &req)
	if strings.Join(path, " ") != "PENDING SCHEDULED DISPATCHED RUNNING SUCCEEDED" || j.Worker != "w1" ||
		j.Tenant != "default" || req["topic"] != "job.echo" || req["job_id"] != sub.JobID {
		t.Fatalf("job: path %v worker %q tenant %q request %s", path, j.Worker, j.Tenant, j.Request)
	}
	if _, ok := j.Fields["req"]; ok {
		t.Fatal("raw request bytes leak into fields")
	}
	// A second submit of the same id is a duplicate, absorbed by the node.
	if again, err := c.Submit(ctx, &capv1.JobRequest{JobId: sub.JobID, Topic: "job.echo"}); err != nil ||
		!again.Duplicate || again.State != "SUCCEEDED" {
		t.Fatalf("duplicate submit: %+v %v", again, err)
	}
	// Cancelling a finished job says so.
	if _, err := c.Cancel(ctx, sub.JobID, "", ""); apiStatus(err) != http.StatusConflict {
		t.Fatalf("cancel of a finished job: %v, want 409", err)
	}
	// An invalid request is refused up front.
	if _, err := c.Submit(ctx, &capv1.JobRequest{JobId: "bad id*", Topic: "job.echo"}); apiStatus(err) != http.StatusBadRequest {
		t.Fatalf("invalid job id: %v, want 400", err)
	}
	if _, err := c.Job(ctx, "no-such-job"); apiStatus(err) != http.StatusNotFound {
		t.Fatalf("unknown job: %v, want 404", err)
	}

	// Approval: the job waits, is approved, and runs.
	ra := echoReq("job-approve", "")
	ra.Labels = map[string]string{"cordum.policy": "approve"}
	if _, err := c.Submit(ctx, ra); err != nil {
		t.Fatal(err)
	}
	b.waitState(c, "job-approve", "APPROVAL_REQUIRED")
	if _, err := c.Decide(ctx, "job-approve", "approve", "looks fine", "", ""); err != nil {
		t.Fatal(err)
	}
	j = b.waitState(c, "job-approve", "SUCCEEDED")
	if i := slices.IndexFunc(j.Decisions, func(d admin.Decision) bool { return d.Kind == "approval" }); i < 0 ||
		j.Decisions[i].By != "api" || j.Decisions[i].Decision != "approved" || j.Decisions[i].At == nil {
		t.Fatalf("approval decision: %+v", j.Decisions)
	}
	// Approving a job that no longer waits is a conflict.
	if _, err := c.Decide(ctx, "job-approve", "approve", "", "", ""); apiStatus(err) != http.StatusConflict {
		t.Fatalf("second approval: %v, want 409", err)
	}

	// Listing pages through every job of a state, newest first.
	for _, id := range []string{"job-l1", "job-l2", "job-l3"} {
		if _, err := c.Submit(ctx, echoReq(id, "")); err != nil {
			t.Fatal(err)
		}
		b.waitState(c, id, "SUCCEEDED")
	}
	var listed []string
	cursor := ""
	for page := 0; page < 10; page++ {
		l, err := c.ListJobs(ctx, "SUCCEEDED", 2, cursor, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Jobs) > 2 {
			t.Fatalf("page of %d with limit 2", len(l.Jobs))
		}
		for _, s := range l.Jobs {
			listed = append(listed, s.ID)
		}
		if cursor = l.Next; cursor == "" {
			break
		}
	}
	if len(listed) != 5 || listed[0] != "job-l3" || listed[1] != "job-l2" || listed[2] != "job-l1" {
		t.Fatalf("listed %v, want the 5 SUCCEEDED jobs newest first", listed)
	}
	if _, err := c.ListJobs(ctx, "NOT_A_STATE", 0, "", ""); apiStatus(err) != http.StatusBadRequest {
		t.Fatalf("unknown state: %v, want 400", err)
	}
	if _, err := c.ListJobs(ctx, "SUCCEEDED", 0, "garbage", ""); apiStatus(err) != http.StatusBadRequest {
		t.Fatalf("bad cursor: %v, want 400", err)
	}
}

func TestCancelARunningJob(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	c := b.client("")
	b.startWorker("w-hang", hang)
	if _, err := c.Submit(ctx, echoReq("job-hang", "")); err != nil {
		t.Fatal(err)
	}
	b.waitState(c, "job-hang", "DISPATCHED")
	if _, err := c.Cancel(ctx, "job-hang", "operator says stop", "bob"); err != nil {
		t.Fatal(err)
	}
	j := b.waitState(c, "job-hang", "CANCELLED")
	if i := slices.IndexFunc(j.Decisions, func(d admin.Decision) bool { return d.Kind == "cancel" }); i < 0 ||
		j.Decisions[i].By != "bob" || j.Decisions[i].Reason != "operator says stop" {
		t.Fatalf("cancel decision: %+v", j.Decisions)
	}
}

func TestDLQRetryRunsTheJobAgainUnderALinkedID(t *testing.T) {
	t.Parallel()
	b := setup(t, options{keys: testKeys})
	ctx := context.Background()
	c := b.client(keyAll)
	b.startWorker("w1", worker.Echo)

	// A topic nobody maps fails after the grace window and is dead-lettered.
	if _, err := c.Submit(ctx, &capv1.JobRequest{JobId: "job-lost", Topic: "job.unmapped", TenantId: "a"}); err != nil {
		t.Fatal(err)
	}
	b.waitState(c, "job-lost", "FAILED")
	var entry admin.DLQEntry
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && entry.ID == ""; time.Sleep(20 * time.Millisecond) {
		d, err := c.DLQ(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range d.Entries {
			if e.JobID == "job-lost" {
				entry = e
			}
		}
	}
	if entry.ID == "" || entry.Reason != "topic_unmapped" || entry.Tenant != "a" {
		t.Fatalf("DLQ entry %+v", entry)
	}

	// The operator maps the topic, then retries the entry.
	if _, err := c.SetPool(ctx, "job.unmapped", []string{"echo"}); err != nil {
		t.Fatal(err)
	}
	// The node's watcher picks the mapping up from Redis within a poll.
	for deadline := time.Now().Add(10 * time.Second); inspect.Of(b.node).PoolConfig().Topics["job.unmapped"] == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the node never loaded the runtime mapping")
		}
	}
	retried, err := b.client(keyA).RetryDLQ(ctx, entry.ID, false)
	if err != nil || retried.RetryOf != "job-lost" || retried.JobID != "job-lost-retry1" {
		t.Fatalf("retry: %+v %v", retried, err)
	}
	nj := b.waitState(c, retried.JobID, "SUCCEEDED")
	if nj.RetryOf != "job-lost" || nj.DLQEntry != entry.ID || nj.Tenant != "a" {
		t.Fatalf("retried job links: retry_of %q dlq_entry %q tenant %q", nj.RetryOf, nj.DLQEntry, nj.Tenant)
	}
	if oj, err := c.Job(ctx, "job-lost"); err != nil || !slices.Equal(oj.Retries, []string{"job-lost-retry1"}) {
		t.Fatalf("original's retries: %+v %v", oj.Retries, err)
	}
	// The entry shows what it became, and is not retried twice by accident.
	d, _ := c.DLQ(ctx, 10)
	if i := slices.IndexFunc(d.Entries, func(e admin.DLQEntry) bool { return e.ID == entry.ID }); i < 0 ||
		d.Entries[i].RetriedAs != "job-lost-retry1" {
		t.Fatalf("entry after retry: %+v", d.Entries)
	}
	if _, err := c.RetryDLQ(ctx, entry.ID, false); apiStatus(err) != http.StatusConflict {
		t.Fatalf("second retry: %v, want 409", err)
	}
	if again, err := c.RetryDLQ(ctx, entry.ID, true); err != nil || again.JobID != "job-lost-retry2" {
		t.Fatalf("forced retry: %+v %v", again, err)
	}
	// Delete, and it is gone.
	if err := c.DeleteDLQ(ctx, entry.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteDLQ(ctx, entry.ID); apiStatus(err) != http.StatusNotFound {
		t.Fatalf("second delete: %v, want 404", err)
	}
	if _, err := c.RetryDLQ(ctx, "not-an-id", false); apiStatus(err) != http.StatusNotFound {
		t.Fatalf("retry of a malformed id: %v, want 404", err)
	}
}

func TestWorkersAndPoolMappings(t *testing.T) {
	t.Parallel()
	b := setup(t, options{keys: testKeys})
	ctx := context.Background()
	c := b.client(keyAll)
	b.startWorker("w1", worker.Echo)

	ws, err := b.client(keyA).Workers(ctx)
	if err != nil || len(ws.Workers) != 1 || ws.Workers[0].ID != "w1" || ws.Workers[0].MaxParallel != 4 {
		t.Fatalf("workers: %+v %v", ws, err)
	}
	if len(ws.Pools) != 1 || ws.Pools[0].Pool != "echo" || ws.Pools[0].Workers != 1 {
		t.Fatalf("pools load: %+v", ws.Pools)
	}

	pl, err := c.Pools(ctx)
	if err != nil || len(pl.Topics) != 1 || pl.Topics[0].Topic != "job.echo" || pl.Topics[0].Source != "file" ||
		!slices.Equal(pl.Topics[0].Pools, []string{"echo"}) {
		t.Fatalf("pools: %+v %v", pl, err)
	}
	if _, err := c.SetPool(ctx, "job.new.kind", []string{"echo", "gpu"}); err != nil {
		t.Fatal(err)
	}
	m, err := c.Pool(ctx, "job.new.kind")
	if err != nil || m.Source != "runtime" || !slices.Equal(m.Pools, []string{"echo", "gpu"}) {
		t.Fatalf("runtime mapping: %+v %v", m, err)
	}
	if pl, _ := c.Pools(ctx); pl.Version < 1 || len(pl.Topics) != 2 {
		t.Fatalf("pools after set: %+v", pl)
	}
	if _, err := c.SetPool(ctx, "job.bad", []string{"a,b"}); apiStatus(err) != http.StatusBadRequest {
		t.Fatalf("invalid mapping: %v, want 400", err)
	}
	if err := c.DeletePool(ctx, "job.new.kind"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pool(ctx, "job.new.kind"); apiStatus(err) != http.StatusNotFound {
		t.Fatalf("deleted mapping: %v, want 404", err)
	}
	if err := c.DeletePool(ctx, "job.echo"); apiStatus(err) != http.StatusNotFound {
		t.Fatalf("deleting a file mapping: %v, want 404", err)
	}
}

func TestProbesMetricsAndStats(t *testing.T) {
	t.Parallel()
	b := setup(t, options{proxied: true})
	ctx := context.Background()
	c := b.client("")
	b.startWorker("w1", worker.Echo)
	if _, err := c.Submit(ctx, echoReq("job-m", "")); err != nil {
		t.Fatal(err)
	}
	b.waitState(c, "job-m", "SUCCEEDED")

	get := func(path string) (int, string) {
		t.Helper()
		res, err := http.Get(b.base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	if st, body := get("/healthz"); st != http.StatusOK || !strings.Contains(body, "ok") {
		t.Fatalf("/healthz: %d %s", st, body)
	}
	if st, body := get("/metrics"); st != http.StatusOK || !strings.Contains(body, "troupe_jobs_received_total 1") ||
		!strings.Contains(body, `troupe_jobs_completed_total{status="SUCCEEDED"} 1`) {
		t.Fatalf("/metrics: %d\n%s", st, body)
	}
	s, err := c.Stats(ctx)
	if err != nil || s.States["SUCCEEDED"] != 1 || s.Received != 1 || s.Completed["SUCCEEDED"] != 1 || s.Node != "node-a" {
		t.Fatalf("stats: %+v %v", s, err)
	}

	r, err := c.Ready(ctx)
	if err != nil || !r.Ready {
		t.Fatalf("ready with everything up: %+v %v", r, err)
	}
	// Redis goes away: the node is not ready, and says why.
	b.proxy.cut()
	r, err = c.Ready(ctx)
	if err != nil || r.Ready || r.Failed[troupe.ReadyRedis] == "" {
		t.Fatalf("ready with Redis cut: %+v %v", r, err)
	}
	if _, ok := r.Failed[troupe.ReadyNATS]; ok {
		t.Fatalf("NATS reported down while only Redis is: %+v", r.Failed)
	}
	if st, _ := get("/healthz"); st != http.StatusOK {
		t.Fatalf("/healthz with Redis cut: %d (liveness must not depend on Redis)", st)
	}
	// Redis comes back: ready again.
	b.proxy.restore()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r, err = c.Ready(ctx); err == nil && r.Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready after Redis came back: %+v %v", r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRequestLimitsAndBrowserGuards(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	// A body over the limit is refused before it is parsed.
	big := strings.NewReader(`{"topic":"job.echo","context_ptr":"` + strings.Repeat("x", admin.MaxBodyBytesDefault) + `"}`)
	res, err := http.Post(b.base+"/v1/jobs", "application/json", big)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: %d, want 413", res.StatusCode)
	}
	// Without keys, a page of another origin cannot write...
	req, _ := http.NewRequest(http.MethodPost, b.base+"/v1/jobs", strings.NewReader(`{"topic":"job.echo"}`))
	req.Header.Set("Origin", "http://evil.example")
	if res, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-origin write: %d, want 403", res.StatusCode)
	}
	// ...and a DNS name pointed at loopback cannot read.
	req, _ = http.NewRequest(http.MethodGet, b.base+"/v1/workers", nil)
	req.Host = "rebound.evil.example"
	if res, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("non-loopback Host: %d, want 403", res.StatusCode)
	}
}

// GET /v1/jobs without a state lists the newest jobs of every state,
// paging like a one-state listing; a tenant key still sees its own only.
func TestListJobsWithoutAStateListsEveryState(t *testing.T) {
	t.Parallel()
	b := setup(t, options{keys: testKeys, node: func(c *troupe.Config) { c.Policy = labelPolicy{} }})
	ctx := context.Background()
	all, ca := b.client(keyAll), b.client(keyA)
	b.startWorker("w1", worker.Echo)
	// Oldest update first; each reaches its state before the next is sent.
	for _, j := range []struct{ id, tenant, policy, state string }{
		{"ls-ok-1", "a", "", "SUCCEEDED"},
		{"ls-denied", "b", "deny", "DENIED"},
		{"ls-waits", "a", "approve", "APPROVAL_REQUIRED"},
		{"ls-ok-2", "b", "", "SUCCEEDED"},
	} {
		req := echoReq(j.id, j.tenant)
		req.Labels = map[string]string{"cordum.policy": j.policy}
		if _, err := all.Submit(ctx, req); err != nil {
			t.Fatal(err)
		}
		b.waitState(all, j.id, j.state)
	}
	list := func(c *admin.Client, limit int) (ids, states []string) {
		t.Helper()
		cursor := ""
		for page := 0; page < 10; page++ {
			l, err := c.ListJobs(ctx, "", limit, cursor, "")
			if err != nil {
				t.Fatalf("list without a state: %v", err)
			}
			if len(l.Jobs) > limit {
				t.Fatalf("page of %d with limit %d", len(l.Jobs), limit)
			}
			for _, s := range l.Jobs {
				ids, states = append(ids, s.ID), append(states, s.State)
			}
			if cursor = l.Next; cursor == "" {
				return ids, states
			}
		}
		t.Fatal("listing never ended")
		return nil, nil
	}
	ids, states := list(all, 3)
	if want := []string{"ls-ok-2", "ls-waits", "ls-denied", "ls-ok-1"}; !slices.Equal(ids, want) {
		t.Fatalf("listed %v, want %v newest first", ids, want)
	}
	if want := []string{"SUCCEEDED", "APPROVAL_REQUIRED", "DENIED", "SUCCEEDED"}; !slices.Equal(states, want) {
		t.Fatalf("states %v, want %v", states, want)
	}
	if ids, _ := list(ca, 1); !slices.Equal(ids, []string{"ls-waits", "ls-ok-1"}) {
		t.Fatalf("tenant a listed %v", ids)
	}
}

// TestCapacityAnUnwrittenWaitIsShownByTheAPI: a job waiting for room within
// its capacity grace has no record yet; GET /v1/jobs/{id} shows it
// SCHEDULED pool_overloaded with its queue position, the SCHEDULED list
// includes it (marked unwritten), and a key of another tenant sees neither.
func TestCapacityAnUnwrittenWaitIsShownByTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, options{keys: testKeys})
	ctx := context.Background()
	ca, cb := b.client(keyA), b.client(keyB)
	b.startWorker("w-full", hang) // max_parallel 4, never answers
	for i := range 4 {
		id := "busy-" + strconv.Itoa(i)
		if _, err := ca.Submit(ctx, echoReq(id, "a")); err != nil {
			t.Fatal(err)
		}
		b.waitState(ca, id, "DISPATCHED")
	}
	if _, err := ca.Submit(ctx, echoReq("queued", "a")); err != nil {
		t.Fatal(err)
	}
	var j admin.Job
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if j, err = ca.Job(ctx, "queued"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiting job never showed: %v", err)
		}
	}
	if j.State != "SCHEDULED" || j.Reason != "pool_overloaded" || !j.Unwritten || j.QueuePosition == nil ||
		*j.QueuePosition != 0 || j.Node != "node-a" || j.Tenant != "a" {
		t.Fatalf("waiting job: %+v", j)
	}
	if _, err := b.node.Job(ctx, "queued"); err == nil {
		t.Fatal("the waiting job has a record")
	}
	list, err := ca.ListJobs(ctx, "SCHEDULED", 10, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Jobs) != 1 || list.Jobs[0].ID != "queued" || !list.Jobs[0].Unwritten {
		t.Fatalf("SCHEDULED list: %+v", list.Jobs)
	}
	if _, err := cb.Job(ctx, "queued"); apiStatus(err) != 404 {
		t.Fatalf("tenant b reading tenant a's waiting job: %v", err)
	}
	if list, err := cb.ListJobs(ctx, "SCHEDULED", 10, "", ""); err != nil || len(list.Jobs) != 0 {
		t.Fatalf("tenant b's SCHEDULED list: %+v, %v", list.Jobs, err)
	}
}
