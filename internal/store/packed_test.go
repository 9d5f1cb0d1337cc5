package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// createWithDecision creates id DISPATCHED on node n with a policy
// decision's fields among its plan's, as a node's create does.
func createWithDecision(t *testing.T, b *bundle, id, n string) *store.Result {
	t.Helper()
	r := b.do(t, &store.Op{Kind: store.OpActivate, JobID: id, Node: n, Create: true, Topic: "job.x",
		Tenant: "acme", TraceID: "tr-" + id, Request: []byte("req"),
		T: &store.Transition{Path: []store.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonAllowed},
			{To: jobstate.StateDispatched, Reason: jobstate.ReasonDispatched}}, Op: "op1",
			Due: time.Now().Add(time.Minute).UnixMilli(),
			Fields: []string{"worker", "w1", "policy_decision", "allow", "subj", "cap.w1",
				"policy_reason", "a: reason with | and :7: in it", "rule_id", "r1", "policy_snapshot", ""}}})
	if r.Status != store.ActivateCreated {
		t.Fatalf("create %s: %+v", id, r)
	}
	return r
}

// TestCreatePacksOperatorFields: a create writes topic, tenant, trace and
// the policy decision's fields as one field, and no fence or node; every
// reader (GetJob, the job list, Tenants, an adoption) still sees each of
// them, and a field written on its own later wins over its packed value.
func TestCreatePacksOperatorFields(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	createWithDecision(t, b, "pk1", "na")
	raw, err := b.s.Client().HGetAll(ctx, b.s.Keys().Job("pk1")).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"topic", "tenant", "trace", "node", "fence", "policy_decision", "policy_reason",
		"rule_id", "policy_snapshot"} {
		if _, ok := raw[f]; ok {
			t.Errorf("the create wrote field %s (%q) on its own", f, raw[f])
		}
	}
	if raw["worker"] != "w1" || raw["subj"] != "cap.w1" || raw["op"] != "op1" {
		t.Errorf("fields the core reads back must stay plain: %v", raw)
	}
	want := map[string]string{"topic": "job.x", "tenant": "acme", "trace": "tr-pk1", "node": "na", "fence": "1",
		"policy_decision": "allow", "policy_reason": "a: reason with | and :7: in it", "rule_id": "r1",
		"policy_snapshot": "", "worker": "w1"}
	rec, err := b.s.GetJob(ctx, "pk1")
	if err != nil {
		t.Fatal(err)
	}
	for f, v := range want {
		if got, ok := rec.Fields[f]; !ok || got != v {
			t.Errorf("GetJob field %s = %q (%v), want %q", f, got, ok, v)
		}
	}
	if _, ok := rec.Fields["pd"]; ok {
		t.Error("GetJob shows the packed field itself")
	}
	if rec.Topic != "job.x" || rec.Tenant != "acme" || rec.TraceID != "tr-pk1" || rec.Node != "na" || rec.Fence != 1 {
		t.Errorf("GetJob record: %+v", rec)
	}
	tenants, err := b.s.Tenants(ctx, []string{"pk1", "none"})
	if err != nil || len(tenants) != 1 || tenants["pk1"] != "acme" {
		t.Errorf("Tenants: %v, %v", tenants, err)
	}
	page, err := b.s.ListJobs(ctx, store.ListQuery{State: jobstate.StateDispatched, Tenant: "acme"})
	if err != nil || len(page.Jobs) != 1 || page.Jobs[0].Topic != "job.x" || page.Jobs[0].Tenant != "acme" {
		t.Errorf("job list: %+v, %v", page, err)
	}
	// A later plain write of a packed field wins.
	r := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "pk1", Node: "na", LockValue: jobstate.LockValue("na", 1),
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StateDispatched),
			Path:   []store.Hop{{To: jobstate.StateRunning, Reason: jobstate.ReasonStarted}},
			Fields: []string{"rule_id", "r2"}}})
	if !r.OK() {
		t.Fatalf("transition: %+v", r)
	}
	// Another node adopts it (the lock released first): fence 2, node nb,
	// and the adoption's fields show the packed ones.
	if err := b.s.Client().Del(ctx, b.s.Keys().Lock("pk1")).Err(); err != nil {
		t.Fatal(err)
	}
	a := b.activate(t, "pk1", "nb", false)
	if a.Status != store.ActivateAdopted || a.Fence != 2 || a.Fields["node"] != "nb" || a.Fields["fence"] != "2" ||
		a.Fields["rule_id"] != "r2" || a.Fields["trace"] != "tr-pk1" || a.Fields["policy_decision"] != "allow" {
		t.Fatalf("adoption: %+v", a)
	}
	rec, err = b.s.GetJob(ctx, "pk1")
	if err != nil || rec.Node != "nb" || rec.Fence != 2 || rec.Fields["rule_id"] != "r2" {
		t.Fatalf("after the adoption: %+v, %v", rec, err)
	}
}

// TestRecordOfOlderNodeReads: a record as the version before packing
// wrote it (every field on its own, fence and node included) reads the
// same through GetJob, the job list and Tenants, and its adoption counts
// its fence up from the field (a rolling upgrade).
func TestRecordOfOlderNodeReads(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	k := b.s.Keys()
	id := "old1"
	sh := store.Shard(id)
	now := time.Now().UnixMilli()
	// The create of 920930c, field for field (lua/activate.lua then).
	old := []string{"s", "DISPATCHED", "fence", "3", "topic", "job.old", "tenant", "t-old", "trace", "tr-old",
		"req", "req", "created", "1795729906648", "node", "n-old", "reason", "dispatched",
		"h1", "0|PENDING|submitted|n-old", "h2", "0|SCHEDULED|policy_allowed|", "h3", "0|DISPATCHED|dispatched|",
		"hn", "3", "worker", "w1", "subj", "s1", "attempts", "1", "policy_decision", "allow",
		"policy_reason", "old reason", "rule_id", "r-old", "policy_snapshot", "v1", "op", "o1"}
	args := make([]interface{}, len(old))
	for i, v := range old {
		args[i] = v
	}
	if err := b.s.Client().HSet(ctx, k.Job(id), args...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.s.Client().ZAdd(ctx, k.Index(sh, "DISPATCHED"), redis.Z{Score: float64(now), Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
	rec, err := b.s.GetJob(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Topic != "job.old" || rec.Tenant != "t-old" || rec.TraceID != "tr-old" || rec.Node != "n-old" ||
		rec.Fence != 3 || rec.Fields["rule_id"] != "r-old" || rec.Fields["policy_reason"] != "old reason" ||
		len(rec.History) != 3 {
		t.Errorf("GetJob of an older record: %+v", rec)
	}
	tenants, err := b.s.Tenants(ctx, []string{id})
	if err != nil || tenants[id] != "t-old" {
		t.Errorf("Tenants: %v, %v", tenants, err)
	}
	page, err := b.s.ListJobs(ctx, store.ListQuery{State: jobstate.StateDispatched, Tenant: "t-old",
		Match: func(j *store.JobSummary) bool { return j.Topic == "job.old" }})
	if err != nil || len(page.Jobs) != 1 || page.Jobs[0].Tenant != "t-old" {
		t.Errorf("job list: %+v, %v", page, err)
	}
	a := b.activate(t, id, "n-new", false)
	if a.Status != store.ActivateAdopted || a.Fence != 4 || a.Fields["fence"] != "4" || a.Fields["node"] != "n-new" ||
		a.Fields["topic"] != "job.old" || a.Fields["worker"] != "w1" {
		t.Fatalf("adoption of an older record: %+v", a)
	}
}
