package admin_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/worker"
)

// Keys of the approval tests: two operators and a client of tenant t.
const (
	keyOpAlice  = "operator-alice-0123456789"
	keyOpBob    = "operator-bob-0123456789ab"
	keyClientT  = "client-of-t-0123456789abc"
	approvalTen = "t"
)

var approvalKeys = map[string]admin.Key{
	keyOpAlice: {Tenant: approvalTen, Role: admin.RoleOperator, Name: "alice"},
	keyOpBob:   {Tenant: approvalTen, Role: admin.RoleOperator, Name: "bob"},
	keyClientT: {Tenant: approvalTen, Name: "svc-t"},
}

func approvalSetup(t *testing.T) *bundle {
	return setup(t, options{admin: func(c *admin.Config) { c.Keys = approvalKeys },
		node: func(c *troupe.Config) { c.Policy = labelPolicy{} }})
}

// submitHeld submits, with key, a job that waits for approval.
func (b *bundle) submitHeld(key, id string) {
	b.t.Helper()
	req := echoReq(id, "")
	req.Labels = map[string]string{"cordum.policy": "approve"}
	if _, err := b.client(key).Submit(context.Background(), req); err != nil {
		b.t.Fatalf("submit %s: %v", id, err)
	}
	b.waitState(b.client(key), id, "APPROVAL_REQUIRED")
}

func (b *bundle) refused(reason string) float64 {
	b.t.Helper()
	mfs, err := b.node.Metrics().Gather()
	if err != nil {
		b.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "troupe_api_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// Attack 5: any key of the job's tenant approved it. Approving needs the
// operator role.
func TestAttackApprovalByAClientKeyIsRefused(t *testing.T) {
	t.Parallel()
	b := approvalSetup(t)
	b.submitHeld(keyClientT, "job-client")
	ctx := context.Background()
	for _, action := range []string{"approve", "reject"} {
		if _, err := b.client(keyClientT).Decide(ctx, "job-client", action, "", "", ""); apiStatus(err) != http.StatusForbidden {
			t.Fatalf("a client key %ss: %v, want 403", action, err)
		}
	}
	if n := b.refused(admin.RefusedNotOperator); n != 2 {
		t.Fatalf("refusals counted %v, want 2", n)
	}
	if _, err := b.client(keyOpAlice).Decide(ctx, "job-client", "approve", "", "", ""); err != nil {
		t.Fatalf("an operator of the tenant approves: %v", err)
	}
}

// Attack 5: the submitter's own key approved its job.
func TestAttackSelfApprovalIsRefused(t *testing.T) {
	t.Parallel()
	b := approvalSetup(t)
	ctx := context.Background()
	b.submitHeld(keyOpAlice, "job-alice")
	// The body cannot unset who submitted: the API stamps it.
	req := echoReq("job-alice-2", "")
	req.Labels = map[string]string{"cordum.policy": "approve", admin.SubmittedByLabel: "someone-else"}
	if _, err := b.client(keyOpAlice).Submit(ctx, req); err != nil {
		t.Fatal(err)
	}
	b.waitState(b.client(keyOpAlice), "job-alice-2", "APPROVAL_REQUIRED")
	for _, id := range []string{"job-alice", "job-alice-2"} {
		if _, err := b.client(keyOpAlice).Decide(ctx, id, "approve", "", "", ""); apiStatus(err) != http.StatusForbidden {
			t.Fatalf("alice approves her own %s: %v, want 403", id, err)
		}
	}
	if n := b.refused(admin.RefusedSelfApproval); n != 2 {
		t.Fatalf("self-approvals counted %v, want 2", n)
	}
	if _, err := b.client(keyOpBob).Decide(ctx, "job-alice", "approve", "", "", ""); err != nil {
		t.Fatalf("bob approves alice's job: %v", err)
	}
}

// The self-approval rule can be turned off (a one-person deployment).
func TestSelfApprovalAllowedWhenConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, options{admin: func(c *admin.Config) { c.Keys = approvalKeys; c.AllowSelfApproval = true },
		node: func(c *troupe.Config) { c.Policy = labelPolicy{} }})
	b.submitHeld(keyOpAlice, "job-own")
	if _, err := b.client(keyOpAlice).Decide(context.Background(), "job-own", "approve", "", "", ""); err != nil {
		t.Fatalf("self-approval with AllowSelfApproval: %v", err)
	}
}

// Attack 5: "by" was free text from the body. The recorded approver is
// the key's principal; a body naming someone else is refused.
func TestAttackApprovalByFromTheBodyIsRefused(t *testing.T) {
	t.Parallel()
	b := approvalSetup(t)
	b.startWorker("w1", worker.Echo)
	b.submitHeld(keyClientT, "job-by")
	ctx := context.Background()
	if _, err := b.client(keyOpBob).Decide(ctx, "job-by", "approve", "", "the-ceo", ""); apiStatus(err) != http.StatusForbidden {
		t.Fatalf("bob approves as the-ceo: %v, want 403", err)
	}
	if _, err := b.client(keyOpBob).Decide(ctx, "job-by", "approve", "ok", "bob", ""); err != nil {
		t.Fatalf("bob approves, by naming himself: %v", err)
	}
	j := b.waitState(b.client(keyOpBob), "job-by", "SUCCEEDED")
	i := slices.IndexFunc(j.Decisions, func(d admin.Decision) bool { return d.Kind == "approval" })
	if i < 0 || j.Decisions[i].By != "bob" {
		t.Fatalf("approval decision %+v, want by bob", j.Decisions)
	}
}

// Attack 5: an empty hash became the recorded hash. The recorded hash is
// the one computed from the job's stored request, whatever the body says.
func TestAttackApprovalWithEmptyHashRecordsTheJobsHash(t *testing.T) {
	t.Parallel()
	b := approvalSetup(t)
	b.submitHeld(keyClientT, "job-hash")
	ctx := context.Background()
	if _, err := b.client(keyOpBob).Decide(ctx, "job-hash", "approve", "", "", "not-the-hash"); apiStatus(err) != http.StatusConflict {
		t.Fatalf("approve with another hash: %v, want 409", err)
	}
	if _, err := b.client(keyOpBob).Decide(ctx, "job-hash", "approve", "", "", ""); err != nil {
		t.Fatal(err)
	}
	rec, err := inspect.Of(b.node).Job(ctx, "job-hash")
	if err != nil {
		t.Fatal(err)
	}
	req := &capv1.JobRequest{}
	if err := proto.Unmarshal(rec.Request, req); err != nil {
		t.Fatal(err)
	}
	want := safety.HashJobRequest(req)
	if got := rec.Fields["approval_hash"]; got == "" || got != want {
		t.Fatalf("recorded approval hash %q, want the request's %q", got, want)
	}
}

// Attack 5: a reject was overwritten by an approve a moment later (the job
// waits for a due poller between the decision and acting on it). The
// first decision stands.
func TestAttackRejectThenApproveIsAConflict(t *testing.T) {
	t.Parallel()
	b := approvalSetup(t)
	b.startWorker("w1", worker.Echo)
	b.submitHeld(keyClientT, "job-rj")
	ctx := context.Background()
	if _, err := b.client(keyOpAlice).Decide(ctx, "job-rj", "reject", "no", "", ""); err != nil {
		t.Fatal(err)
	}
	for _, action := range []string{"approve", "reject"} {
		if _, err := b.client(keyOpBob).Decide(ctx, "job-rj", action, "", "", ""); apiStatus(err) != http.StatusConflict {
			t.Fatalf("%s after a reject: %v, want 409", action, err)
		}
	}
	if n := b.refused(admin.RefusedAlreadyDecided); n < 1 {
		t.Fatalf("later decisions counted %v, want ≥ 1", n)
	}
	j := b.waitState(b.client(keyOpAlice), "job-rj", "DENIED")
	i := slices.IndexFunc(j.Decisions, func(d admin.Decision) bool { return d.Kind == "approval" })
	if i < 0 || j.Decisions[i].By != "alice" || j.Decisions[i].Decision != "rejected" {
		t.Fatalf("decision %+v, want alice's reject", j.Decisions)
	}
}

// Attack 8: /metrics and /readyz answered anyone with API keys configured.
// With MetricsNeedKey, /metrics needs an all-tenant key and /readyz a key;
// /healthz stays open.
func TestAttackMetricsAndReadyzNeedAKeyWhenConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, options{keys: testKeys, admin: func(c *admin.Config) { c.MetricsNeedKey = true }})
	get := func(path, key string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, b.base+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	for _, c := range []struct {
		path, key string
		want      int
	}{
		{"/metrics", "", http.StatusUnauthorized},
		{"/metrics", keyA, http.StatusForbidden},
		{"/metrics", keyAll, http.StatusOK},
		{"/readyz", "", http.StatusUnauthorized},
		{"/readyz", "not-a-key-of-this-server", http.StatusUnauthorized},
		{"/readyz", keyA, http.StatusOK},
		{"/healthz", "", http.StatusOK},
	} {
		if got := get(c.path, c.key); got != c.want {
			t.Errorf("GET %s with key %q: %d, want %d", c.path, c.key, got, c.want)
		}
	}
	// Without the flag both stay open (a scraper and a probe need no key).
	open := setup(t, options{keys: testKeys})
	for _, path := range []string{"/metrics", "/readyz"} {
		res, err := http.Get(open.base + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("GET %s without the flag: %d, want 200", path, res.StatusCode)
		}
	}
}

func TestParseKeyEntriesRolesAndNames(t *testing.T) {
	t.Parallel()
	keys, err := admin.ParseKeyEntries("old-style-0123456789=*\nold-tenant-0123456789=acme\n" +
		"op-key-0123456789 = acme role=operator name=alice, cl-key-0123456789=acme role=client\n")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]admin.Key{
		"old-style-0123456789":  {Tenant: "*"},
		"old-tenant-0123456789": {Tenant: "acme"},
		"op-key-0123456789":     {Tenant: "acme", Role: admin.RoleOperator, Name: "alice"},
		"cl-key-0123456789":     {Tenant: "acme", Role: admin.RoleClient},
	}
	if len(keys) != len(want) {
		t.Fatalf("keys %v", keys)
	}
	for k, v := range want {
		if keys[k] != v {
			t.Errorf("%s: %+v, want %+v", k, keys[k], v)
		}
	}
	if admin.DefaultRole("*") != admin.RoleOperator || admin.DefaultRole("acme") != admin.RoleClient {
		t.Fatal("default roles: an old * key stays an operator, an old tenant key is a client")
	}
	for _, bad := range []string{"k-0123456789abcdef=acme role", "k-0123456789abcdef=acme colour=red"} {
		if _, err := admin.ParseKeyEntries(bad); err == nil || strings.Contains(err.Error(), "0123456789") {
			t.Errorf("%q: err %v (want an error without the key)", bad, err)
		}
	}
	var node admin.Node = inspect.Of((*troupe.Node)(nil))
	for _, bad := range []map[string]admin.Key{
		{"k-0123456789abcdef": {Tenant: "acme", Role: "root"}},
		{"k-0123456789abcdef": {Tenant: "acme", Name: "a b"}},
		{"k-0123456789abcdef": {Tenant: "acme", Name: "x"}, "k-0123456789abcdeg": {Tenant: "acme", Name: "x"}},
	} {
		if _, err := admin.NewServer(admin.Config{Node: node, Registry: newRegistry(), Listen: "127.0.0.1:0", Keys: bad}); err == nil {
			t.Errorf("keys %v accepted", bad)
		}
	}
}
