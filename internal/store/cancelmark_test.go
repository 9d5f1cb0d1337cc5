package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// TestCancelMarkCreatesTheJobCancelled: a cancel recorded for a job with no
// record makes the job's create (with a dispatch plan) create it CANCELLED
// instead — history PENDING → CANCELLED with who and why, its submit time
// kept, no lock, no due entry, in the CANCELLED index — and the mark is
// gone. A mark for another tenant is ignored (the job is created with its
// plan); a mark for a job with a record is refused; a mark expires.
func TestCancelMarkCreatesTheJobCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rdb, keys := b.s.Client(), b.s.Keys()
	plan := func(sub int64) *store.Transition {
		return &store.Transition{Path: []store.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonAllowed},
			{To: jobstate.StateDispatched, Reason: jobstate.ReasonDispatched}}, Due: time.Now().Add(time.Minute).UnixMilli(),
			Fields: []string{"worker", "w1", store.FieldSubmitted, "1700000000000", "subj", "cap.w1"}}
	}
	create := func(id, tenant string) *store.Result {
		return b.do(t, &store.Op{Kind: store.OpActivate, JobID: id, Node: "n", Create: true, Topic: "job.x",
			Tenant: tenant, TraceID: "tr", Request: []byte("req"), T: plan(0)})
	}

	if err := b.s.MarkCancel(ctx, "cm-1", []string{"t"}, "alice\nx", "not needed"); err != nil {
		t.Fatal(err)
	}
	tenants, ttl, err := b.s.CancelMarked(ctx, "cm-1")
	if err != nil || len(tenants) != 1 || tenants[0] != "t" || ttl < store.CancelMarkTTL-time.Minute {
		t.Fatalf("mark: tenants %v ttl %v err %v", tenants, ttl, err)
	}
	r := create("cm-1", "t")
	if r.Status != store.ActivateCancelled || r.Fields["cancelled_by"] != "alice x" || r.Fields["cancel_reason"] != "not needed" {
		t.Fatalf("create with a mark: %+v", r)
	}
	rec, err := b.s.GetJob(ctx, "cm-1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != jobstate.StateCancelled || rec.Reason != jobstate.ReasonCancelRequested || rec.Fields["worker"] != "" ||
		rec.LockHolder != "" || len(rec.History) != 2 || rec.History[1].To != jobstate.StateCancelled ||
		rec.History[0].At.UnixMilli() != 1700000000000 {
		t.Fatalf("record: %+v", rec)
	}
	if n, _ := rdb.Exists(ctx, keys.CancelMark("cm-1")).Result(); n != 0 {
		t.Fatal("the mark outlived the create")
	}
	if _, err := rdb.ZScore(ctx, keys.Due(store.Shard("cm-1")), "cm-1").Result(); err == nil {
		t.Fatal("a job created cancelled has a due entry")
	}
	if _, err := rdb.ZScore(ctx, keys.Index(store.Shard("cm-1"), string(jobstate.StateCancelled)), "cm-1").Result(); err != nil {
		t.Fatalf("not in the CANCELLED index: %v", err)
	}
	// A second create is the terminal job's.
	if r := create("cm-1", "t"); r.Status != store.ActivateTerminal {
		t.Fatalf("create again: %+v", r)
	}

	// Another tenant's mark does not cancel the job.
	if err := b.s.MarkCancel(ctx, "cm-2", []string{"other"}, "mallory", "x"); err != nil {
		t.Fatal(err)
	}
	if r := create("cm-2", "t"); r.Status != store.ActivateCreated || r.State != jobstate.StateDispatched {
		t.Fatalf("another tenant's mark: %+v", r)
	}
	// A job with a record is cancelled the usual way.
	if err := b.s.MarkCancel(ctx, "cm-2", []string{"t"}, "alice", "x"); !errors.Is(err, store.ErrJobExists) {
		t.Fatalf("mark of a job with a record: %v", err)
	}
	// AnyTenant's mark cancels a job of any tenant.
	if err := b.s.MarkCancel(ctx, "cm-3", []string{store.AnyTenant}, "op", "x"); err != nil {
		t.Fatal(err)
	}
	if r := create("cm-3", "zzz"); r.Status != store.ActivateCancelled {
		t.Fatalf("any tenant's mark: %+v", r)
	}
	// A mark for a job that never comes expires.
	if err := b.s.MarkCancel(ctx, "cm-4", []string{"t"}, "alice", "x"); err != nil {
		t.Fatal(err)
	}
	if err := rdb.PExpire(ctx, keys.CancelMark("cm-4"), 50*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if n, _ := rdb.Exists(ctx, keys.CancelMark("cm-4")).Result(); n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the mark did not expire")
		}
	}
	if r := create("cm-4", "t"); r.Status != store.ActivateCreated {
		t.Fatalf("after the mark expired: %+v", r)
	}
}

// TestCancelMarkOutlivesAHeldSubmit: a submit the stream keeps unconsumed
// for as long as it may still finds its mark.
func TestCancelMarkOutlivesAHeldSubmit(t *testing.T) {
	if store.CancelMarkTTL < bus.StreamMaxAge {
		t.Fatalf("CancelMarkTTL %v is shorter than the submit stream's max age %v", store.CancelMarkTTL, bus.StreamMaxAge)
	}
}

// TestCancelMarkCreateWritesTopicTenantTrace: a create sends topic, tenant
// and trace once, packed in its "pd" field; the create that a mark
// cancels reads them back from there and writes them as plain fields, as
// before, whatever they hold (colons and digits, a long topic, empty
// values), and matches the mark by that tenant — for creates flushed on
// their own and several in one call.
func TestCancelMarkCreateWritesTopicTenantTrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cases := []struct{ id, topic, tenant, trace string }{
		{"cmt-1", "job.x", "t:1:x", "tr:2:"},
		{"cmt-2", "job." + strings.Repeat("long:", 20), "12:ab", ""},
		{"cmt-3", "", "", "0"},
		{"cmt-4", ":", "::", "tenant:3:abc"},
	}
	for _, c := range cases {
		if err := b.s.MarkCancel(ctx, c.id, []string{c.tenant}, "alice", "why"); err != nil {
			t.Fatal(err)
		}
	}
	op := func(c struct{ id, topic, tenant, trace string }) *store.Op {
		return &store.Op{Kind: store.OpActivate, JobID: c.id, Node: "n", Create: true, Topic: c.topic,
			Tenant: c.tenant, TraceID: c.trace, Request: []byte("req"),
			T: &store.Transition{Path: []store.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonAllowed}},
				Fields: []string{"worker", "w1", "policy_decision", "allow", "policy_reason", "topic:5:other"}}}
	}
	// The first alone, the others submitted together.
	if r := b.do(t, op(cases[0])); r.Status != store.ActivateCancelled {
		t.Fatalf("%s: %+v", cases[0].id, r)
	}
	done := make(chan *store.Result, len(cases))
	for _, c := range cases[1:] {
		o := op(c)
		o.Done = func(r *store.Result) { done <- r }
		b.w.Submit(o)
	}
	for range cases[1:] {
		select {
		case r := <-done:
			if r.Err != nil || r.Status != store.ActivateCancelled {
				t.Fatalf("create: %+v", r)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("create timed out")
		}
	}
	for _, c := range cases {
		raw, err := b.s.Client().HGetAll(ctx, b.s.Keys().Job(c.id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if raw["s"] != string(jobstate.StateCancelled) || raw["topic"] != c.topic || raw["tenant"] != c.tenant ||
			raw["trace"] != c.trace {
			t.Errorf("%s: record %q", c.id, raw)
		}
		if _, ok := raw["pd"]; ok {
			t.Errorf("%s: a job created cancelled has a packed field: %q", c.id, raw)
		}
	}
}
