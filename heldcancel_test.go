package troupe_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// TestCancelOfASubmitHeldInTheStreamTakesEffect: submits acknowledged by
// the stream but taken by no node (MaxAdmitting 1, held by a job waiting
// for room) are cancelled through the API (an all-tenant key) and through
// CAP. When a node takes them they are created CANCELLED — never
// dispatched (the worker receives neither), the client told exactly once,
// the history showing who cancelled and why — while a cancel recorded by
// another tenant's key leaves its job to run.
func TestCancelOfASubmitHeldInTheStreamTakesEffect(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		noBackoff(c)
		c.Tuning.MaxAdmitting = 1
		c.Tuning.AdmissionHold = time.Hour
		c.Tuning.CapacityGrace = time.Hour
	})
	const keyAll, keyX = "held27-all-tenants-key-0123456789", "held27-tenant-x-key-0123456789ab"
	addr := startAdmin(t, f.node, map[string]string{keyAll: admin.AllTenants, keyX: "tenant-x"})
	api := admin.NewClient(addr, keyAll)
	apiX := admin.NewClient(addr, keyX)
	results := f.results()

	g := newJobGates()
	var mu sync.Mutex
	receipts := map[string]int{}
	w := startCapWorker(t, f.env.NATS, f.subj, "held-w", 1, time.Hour, func(id string) bool {
		mu.Lock()
		receipts[id]++
		mu.Unlock()
		if id == "held-a" || id == "held-b" {
			return g.wait(id)
		}
		return true
	})
	f.waitWorkers(1)
	ctx := context.Background()

	f.submit(echoReq("held-a"))
	if got := w.waitGot(5 * time.Second); got != "held-a" {
		t.Fatalf("worker got %s, want held-a", got)
	}
	f.submit(echoReq("held-b")) // waits for room, holding the node's one admission
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if wj, _ := f.node.WaitingJob(ctx, "held-b"); wj != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("held-b never waited for room")
		}
	}
	f.untilAdmitting(1)
	f.untilNoPulls()
	other := echoReq("held-e")
	other.TenantId = "tenant-e"
	for _, r := range []*capv1.JobRequest{echoReq("held-c"), echoReq("held-d"), other} {
		f.submit(r)
	}
	// Held in the stream: counted SCHEDULED (b waits, c, d, e pending),
	// but no node has them, so none can be read by id.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := api.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.States[string(jobstate.StateScheduled)] == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats: %v, want SCHEDULED 4", st.States)
		}
	}
	var apiErr *admin.APIError
	if _, err := api.Job(ctx, "held-c"); !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound {
		t.Fatalf("GET held-c while held in the stream: %v, want 404", err)
	}

	// c through the API, d through CAP, e through another tenant's key.
	acc, err := api.Cancel(ctx, "held-c", "not wanted", "alice")
	if err != nil || acc.Note != admin.CancelRecordedNote {
		t.Fatalf("API cancel of held-c: %+v, %v; want 202 %q", acc, err, admin.CancelRecordedNote)
	}
	if err := f.node.Cancel(ctx, "held-d", "not wanted either", "bob"); err != nil {
		t.Fatal(err)
	}
	if _, err := apiX.Cancel(ctx, "held-e", "not mine", "xavier"); err != nil {
		t.Fatalf("tenant-x cancel of held-e: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		tenants, _, err := f.node.Store().CancelMarked(ctx, "held-d")
		if err != nil {
			t.Fatal(err)
		}
		if len(tenants) == 1 && tenants[0] == store.AnyTenant {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the CAP cancel of held-d was not recorded")
		}
	}

	// Room: a ends, b is placed and ends, and the node takes c, d and e.
	g.open("held-a", true)
	if got := w.waitGot(10 * time.Second); got != "held-b" {
		t.Fatalf("worker got %s, want held-b", got)
	}
	g.open("held-b", true)
	for _, c := range []struct{ id, by, why string }{{"held-c", "alice", "not wanted"}, {"held-d", "bob", "not wanted either"}} {
		rec := f.waitState(c.id, jobstate.StateCancelled)
		if rec.Fields["cancelled_by"] != c.by || rec.Fields["cancel_reason"] != c.why || rec.Reason != jobstate.ReasonCancelRequested {
			t.Fatalf("%s: by %q why %q reason %s", c.id, rec.Fields["cancelled_by"], rec.Fields["cancel_reason"], rec.Reason)
		}
		if h := rec.History; len(h) != 2 || h[0].To != jobstate.StatePending || h[1].To != jobstate.StateCancelled {
			t.Fatalf("%s history: %s", c.id, reasons(h))
		}
		if r := results(c.id); r.Status != capv1.JobStatus_JOB_STATUS_CANCELLED {
			t.Fatalf("%s: client told %v, want CANCELLED", c.id, r.Status)
		}
	}
	f.waitState("held-e", jobstate.StateSucceeded)
	// After e, one more job: whatever c and d would have been sent, the
	// worker had it by now.
	f.submit(echoReq("held-f"))
	f.waitState("held-f", jobstate.StateSucceeded)
	mu.Lock()
	defer mu.Unlock()
	if receipts["held-c"]+receipts["held-d"] != 0 || receipts["held-e"] != 1 {
		t.Fatalf("worker receipts %v: want none of held-c, held-d, one of held-e", receipts)
	}
}

// untilNoPulls waits (bounded) until no pull of the node waits at the
// server for submits, for two fetch waits in a row: a node at its
// admission bound then takes no more, and what is submitted stays in the
// stream (see TestCapacityABurstWaitsInTheStreamAtMaxAdmitting).
func (f *fixture) untilNoPulls() {
	f.t.Helper()
	ctx := context.Background()
	cons, err := f.js.Consumer(ctx, bus.StreamName(f.env.StreamPrefix(), bus.StreamSubmit), bus.ConsumerName(bus.StreamSubmit))
	if err != nil {
		f.t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for idleSince := (time.Time{}); ; time.Sleep(20 * time.Millisecond) {
		info, err := cons.Info(ctx)
		if err != nil {
			f.t.Fatal(err)
		}
		if info.NumWaiting != 0 {
			idleSince = time.Time{}
		} else if idleSince.IsZero() {
			idleSince = time.Now()
		} else if time.Since(idleSince) > 2*bus.FetchMaxWait {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%d pulls still waiting at the server while the node is at its bound", info.NumWaiting)
		}
	}
}

// TestAWrittenWaitShowsItsQueuePosition: jobs whose wait for room is
// written SCHEDULED at once (CapacityGrace negative) show their place in
// the pool's queue in GET /v1/jobs/{id}, as unwritten waits do: 0 for the
// first, 1 for the next.
func TestAWrittenWaitShowsItsQueuePosition(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		noBackoff(c)
		c.Tuning.CapacityGrace = -1
	})
	api := admin.NewClient(startAdmin(t, f.node, nil), "")
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "qpos", 1, time.Hour, g.wait)
	f.waitWorkers(1)
	f.submit(echoReq("qpos-0"))
	w.waitGot(5 * time.Second)
	ctx := context.Background()
	for i, id := range []string{"qpos-1", "qpos-2"} {
		f.submit(echoReq(id))
		if r := f.waitState(id, jobstate.StateScheduled); r.Reason != jobstate.ReasonPoolOverloaded {
			t.Fatalf("%s waits for %s, want pool_overloaded", id, r.Reason)
		}
		j, err := api.Job(ctx, id)
		if err != nil || j.Unwritten || j.QueuePosition == nil || *j.QueuePosition != i {
			t.Fatalf("GET %s: %+v, %v; want a written wait at queue position %d", id, j, err, i)
		}
	}
	for _, id := range []string{"qpos-0", "qpos-1", "qpos-2"} {
		g.open(id, true)
		f.waitState(id, jobstate.StateSucceeded)
	}
}
