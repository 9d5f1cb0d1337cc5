package troupe_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/core"
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
