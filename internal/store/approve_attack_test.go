package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// holdForApproval puts job id in APPROVAL_REQUIRED with fields.
func (b *bundle) holdForApproval(t *testing.T, id string, fields ...string) {
	t.Helper()
	b.activate(t, id, "a", true)
	r := b.do(t, &store.Op{Kind: store.OpTransition, JobID: id, Node: "a", LockValue: "a|1", T: &store.Transition{
		Expect: jobstate.Expect(jobstate.StatePending), Path: []store.Hop{{To: jobstate.StateApprovalRequired, Reason: "approval_required"}},
		Release: true, Fields: fields}})
	if !r.OK() {
		t.Fatalf("%+v", r)
	}
}

// Attack 5: a job without a recorded hash was approved with an empty one,
// so the decision said nothing about what was approved.
func TestAttackDecisionWithoutJobHashIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.holdForApproval(t, "nohash")
	err := b.s.Decide(context.Background(), "nohash", store.DecisionApproved, "alice", "", "")
	if !errors.Is(err, store.ErrNoJobHash) {
		t.Fatalf("decide on a job without a hash: %v, want ErrNoJobHash", err)
	}
	rec, _ := b.s.GetJob(context.Background(), "nohash")
	if rec.Fields["approval_decision"] != "" {
		t.Fatalf("decision recorded: %v", rec.Fields)
	}
}

// Attack 5: a reject was overwritten by an approve before a node acted on
// it. The first decision stands.
func TestAttackFirstDecisionStands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.holdForApproval(t, "rj", "job_hash", "h1")
	if err := b.s.Decide(ctx, "rj", store.DecisionRejected, "alice", "no", ""); err != nil {
		t.Fatal(err)
	}
	for _, d := range []store.Decision{store.DecisionApproved, store.DecisionRejected} {
		if err := b.s.Decide(ctx, "rj", d, "bob", "", "h1"); !errors.Is(err, store.ErrAlreadyDecided) {
			t.Fatalf("%s after a reject: %v, want ErrAlreadyDecided", d, err)
		}
	}
	rec, _ := b.s.GetJob(ctx, "rj")
	if rec.Fields["approval_decision"] != "rejected" || rec.Fields["approval_by"] != "alice" || rec.Fields["approval_hash"] != "h1" {
		t.Fatalf("record %v, want alice's reject of h1", rec.Fields)
	}
}
