package troupe_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/actors"
	"github.com/troupe-run/troupe/bus"
	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/intake"
	"github.com/troupe-run/troupe/proto/capv1"
)

// untilAdmitting polls the node's admissions count until it is want (10 s).
func (f *fixture) untilAdmitting(want int64) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.node.Admitting() != want {
		if time.Now().After(deadline) {
			f.t.Fatalf("admitting %d, want %d", f.node.Admitting(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWaitsForATenantSlotLeaveTheNodesAdmissions: jobs of one tenant
// waiting for a tenant slot (tenant_limit: written SCHEDULED, their
// submits acked) do not keep their places in MaxAdmitting, so intake goes
// on for every other tenant (issue 27, item 2).
func TestWaitsForATenantSlotLeaveTheNodesAdmissions(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		noBackoff(c)
		c.MaxAdmitting = 4
		c.AdmissionHold = time.Hour
		c.TenantLimits = map[string]int{"hog": 1}
	})
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "wide", 50, time.Hour, g.wait)
	f.waitWorkers(1)
	hog := func(id string) *capv1.JobRequest {
		r := echoReq(id)
		r.TenantId = "hog"
		return r
	}
	f.submit(hog("hog-0"))
	if got := w.waitGot(5 * time.Second); got != "hog-0" {
		t.Fatalf("got %s, want hog-0", got)
	}
	for i := 1; i <= 8; i++ {
		f.submit(hog("hog-" + strconv.Itoa(i)))
	}
	for i := 1; i <= 8; i++ {
		if r := f.waitState("hog-"+strconv.Itoa(i), core.StateScheduled); r.Reason != core.ReasonTenantLimit {
			t.Fatalf("hog-%d waits for %s, want tenant_limit", i, r.Reason)
		}
	}
	f.untilAdmitting(0)
	f.submit(echoReq("other"))
	if got := w.waitGot(10 * time.Second); got != "other" {
		t.Fatalf("got %s, want other (another tenant's job, past the hog's waits)", got)
	}
	g.open("other", true)
	f.waitState("other", core.StateSucceeded)
	g.open("hog-0", true)
	f.waitState("hog-0", core.StateSucceeded)
}

// TestStopKeepsTheInboxUntilTheLocksAreReleased: while a stopping node's
// job actors still hold their locks, a replica forwarding it an event hears
// a refusal at once (and offers the event again a second later), not "no
// responders", which would make it wait for the node's lease to go stale
// (issue 27, item 7).
func TestStopKeepsTheInboxUntilTheLocksAreReleased(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	raw, err := bus.EncodeResult("trace-x", "worker-x", &capv1.JobResult{JobId: "stop-x",
		Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED})
	if err != nil {
		t.Fatal(err)
	}
	forward := intake.Forwarder(f.env.NATS, f.subj)
	var during error
	f.node.BeforeActorsStop(func() { during = forward(f.node.ID(), actors.ForwardResult, raw) })
	if err := f.node.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if during == nil || errors.Is(during, actors.ErrOwnerGone) {
		t.Fatalf("forward while the actors stop: %v; want a refusal, not %v", during, actors.ErrOwnerGone)
	}
	if err := forward(f.node.ID(), actors.ForwardResult, raw); !errors.Is(err, actors.ErrOwnerGone) {
		t.Fatalf("forward after Stop: %v; want %v", err, actors.ErrOwnerGone)
	}
}
