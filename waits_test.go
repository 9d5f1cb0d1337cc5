package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/intake"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/tracing"
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
		c.Tuning.MaxAdmitting = 4
		c.Tuning.AdmissionHold = time.Hour
		c.Tuning.TenantLimits = map[string]int{"hog": 1}
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
		if r := f.waitState("hog-"+strconv.Itoa(i), jobstate.StateScheduled); r.Reason != jobstate.ReasonTenantLimit {
			t.Fatalf("hog-%d waits for %s, want tenant_limit", i, r.Reason)
		}
	}
	f.untilAdmitting(0)
	f.submit(echoReq("other"))
	if got := w.waitGot(10 * time.Second); got != "other" {
		t.Fatalf("got %s, want other (another tenant's job, past the hog's waits)", got)
	}
	g.open("other", true)
	f.waitState("other", jobstate.StateSucceeded)
	g.open("hog-0", true)
	f.waitState("hog-0", jobstate.StateSucceeded)
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
	f.node.BeforeActorsStop(func() { during = forward(f.node.ID(), jobactor.ForwardResult, raw) })
	if err := f.node.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Answered: neither "no responders" nor silence (a timeout, where the
	// server cannot tell that no one listens).
	if during == nil || errors.Is(during, jobactor.ErrOwnerGone) || errors.Is(during, nats.ErrTimeout) {
		t.Fatalf("forward while the actors stop: %v; want the owner's refusal", during)
	}
}

// TestOverloadEveryWaitingJobIsVisibleAndCancellable is the overload of
// issue 27: two replicas, one pool of 2 slots (a worker of max_parallel 2),
// a dozen jobs. The 10 that wait for room — unwritten, within their grace,
// on either replica — are SCHEDULED in the counts, each with its reason
// and queue position in the API, listed on every page; each is cancelled
// through the second replica's API (never a 404), takes the cancel on
// whichever replica holds it (never dead-lettered unknown_job), and is
// never dispatched.
func TestOverloadEveryWaitingJobIsVisibleAndCancellable(t *testing.T) {
	t.Parallel()
	opts := func(c *troupe.Config) {
		noBackoff(c)
		c.Tuning.CapacityGrace = time.Hour
		c.Tuning.UnknownHold = 500 * time.Millisecond // a cancel the holder never gets is dead-lettered at once
	}
	f := newFixture(t, opts)
	a := f.node
	b := newNodeOn(t, f, "node-b", opts)
	f.node = a
	api := admin.NewClient(startAdmin(t, b, nil), "")
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "pair", 2, time.Hour, g.wait)
	f.waitWorkers(1)
	ids := map[string]bool{}
	for i := range 12 {
		id := "ov-" + strconv.Itoa(i)
		ids[id] = true
		f.submit(echoReq(id))
	}
	running := []string{w.waitGot(5 * time.Second), w.waitGot(5 * time.Second)}
	waiting := map[string]bool{}
	for id := range ids {
		waiting[id] = true
	}
	for _, id := range running {
		delete(waiting, id)
	}
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ws, err := b.WaitingJobs(ctx, "", 100)
		if err == nil && len(ws) == len(waiting) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting: %d listed (%v), want %d", len(ws), err, len(waiting))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Counts: the dashboard's and `troupe ctl stats`'s SCHEDULED (the
	// running jobs' submits are acked a moment after their dispatch).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := api.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := st.States[string(jobstate.StateScheduled)]; n == int64(len(waiting)) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("stats: SCHEDULED %d, want %d (states %v)", n, len(waiting), st.States)
		}
	}
	// The API: each is SCHEDULED with its reason and queue position.
	for id := range waiting {
		j, err := api.Job(ctx, id)
		if err != nil || j.State != string(jobstate.StateScheduled) || j.Reason != string(jobstate.ReasonPoolOverloaded) ||
			j.QueuePosition == nil || *j.QueuePosition < 0 {
			t.Fatalf("GET %s: %+v, %v; want SCHEDULED pool_overloaded with a queue position", id, j, err)
		}
	}
	// Lists: every page, 3 jobs a page.
	listed := map[string]bool{}
	for cursor, pages := "", 0; ; pages++ {
		page, err := api.SearchJobs(ctx, admin.JobFilter{State: string(jobstate.StateScheduled)}, 3, cursor)
		if err != nil || pages > 10 {
			t.Fatalf("list page %d: %v", pages, err)
		}
		for _, j := range page.Jobs {
			listed[j.ID] = true
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	for id := range waiting {
		if !listed[id] {
			t.Fatalf("%s not listed on any page (listed %v)", id, listed)
		}
	}
	// The metric: this node's and the other's waits, by reason.
	if n := counter(t, a, "troupe_jobs_waiting", string(jobstate.ReasonPoolOverloaded)) +
		counter(t, b, "troupe_jobs_waiting", string(jobstate.ReasonPoolOverloaded)); n != float64(len(waiting)) {
		t.Fatalf("troupe_jobs_waiting{pool_overloaded} %v across the nodes, want %d", n, len(waiting))
	}
	// Cancel every waiting job through the second replica's API.
	for id := range waiting {
		if _, err := api.Cancel(ctx, id, "overload", "test"); err != nil {
			t.Fatalf("cancel %s: %v", id, err)
		}
	}
	for id := range waiting {
		f.waitState(id, jobstate.StateCancelled)
	}
	es, err := a.Store().ListDLQ(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Reason == jobstate.ReasonUnknownJob {
			t.Fatalf("cancel dead-lettered: %+v", e)
		}
	}
	for _, id := range running {
		g.open(id, true)
		f.waitState(id, jobstate.StateSucceeded)
	}
	f.submit(echoReq("ov-after"))
	if got := w.waitGot(5 * time.Second); got != "ov-after" {
		t.Fatalf("worker got %s after the cancels, want ov-after (no cancelled job is dispatched)", got)
	}
	g.open("ov-after", true)
	f.waitState("ov-after", jobstate.StateSucceeded)
}

// TestStockWorkersOnAPoolSubjectRecoverTheSlotsOfLostJobs: two stock-like
// workers of max_parallel 1 on a pool subject (NATS picks the member) lose
// a job each (taken, never answered: their runner died). Their heartbeats
// report 0 active jobs, which frees those slots within two heartbeats,
// not at the lost jobs' running deadline: 500 jobs then all finish
// (issue 27, item 8).
func TestStockWorkersOnAPoolSubjectRecoverTheSlotsOfLostJobs(t *testing.T) {
	t.Parallel()
	f := newFixture(t, noBackoff)
	answer := func(id string) bool { return !strings.HasPrefix(id, "lost-") }
	w1 := startCapWorker(t, f.env.NATS, f.subj, "stock-1", 1, 100*time.Millisecond, answer)
	w2 := startCapWorker(t, f.env.NATS, f.subj, "stock-2", 1, 100*time.Millisecond, answer)
	f.waitWorkers(2)
	for _, id := range []string{"lost-1", "lost-2"} {
		f.submit(echoReq(id))
		f.waitState(id, jobstate.StateDispatched) // started on delivery: it stays so until its deadline
	}
	for deadline := time.Now().Add(10 * time.Second); w1.received.Load()+w2.received.Load() < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the workers never took the two lost jobs")
		}
		time.Sleep(5 * time.Millisecond)
	}
	const n = 500
	for i := range n {
		f.submit(echoReq("after-" + strconv.Itoa(i)))
	}
	for i := range n {
		f.waitStateWithin("after-"+strconv.Itoa(i), jobstate.StateSucceeded, 60*time.Second)
	}
	// (Which member takes a job on a pool subject is NATS's choice, so a
	// member may get a job while the other is free: counts hold per pool.)
}

// TestTwoReplicasRecoverTheSlotOfAJobLostOnAStockWorker: item 8 with two
// replicas sharing two stock-like workers (max_parallel 1, a pool subject,
// no progress). A job is lost on a worker (taken, never answered): both
// replicas free its slot from the workers' heartbeats of 0 active jobs —
// each counts nothing in flight on either worker, and never less than
// nothing — then every later job succeeds, and once the workers are idle
// again both replicas count nothing in flight. Throughout, the pool never
// runs more jobs at once than its two slots (a job counted on one worker
// may run on the other: its slot is freed only by the pool's reports).
func TestTwoReplicasRecoverTheSlotOfAJobLostOnAStockWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t, noBackoff)
	a := f.node
	b := newNodeOn(t, f, "node-b", noBackoff)
	f.node = a
	var running, most atomic.Int32 // pool-wide, as the workers see it
	answer := func(id string) bool {
		if strings.HasPrefix(id, "lost-") {
			return false
		}
		n := running.Add(1)
		for old := most.Load(); n > old && !most.CompareAndSwap(old, n); old = most.Load() {
		}
		time.Sleep(5 * time.Millisecond) // the job's run
		running.Add(-1)
		return true
	}
	w1 := startCapWorker(t, f.env.NATS, f.subj, "stock-1", 1, 100*time.Millisecond, answer)
	w2 := startCapWorker(t, f.env.NATS, f.subj, "stock-2", 1, 100*time.Millisecond, answer)
	for _, n := range []*troupe.Node{a, b} {
		f.node = n
		f.waitWorkers(2)
	}
	f.node = a
	f.submit(echoReq("lost-1"))
	f.waitState("lost-1", jobstate.StateDispatched) // started on delivery: it stays so until its deadline
	for deadline := time.Now().Add(10 * time.Second); w1.received.Load()+w2.received.Load() < 1; {
		if time.Now().After(deadline) {
			t.Fatal("no worker took the lost job")
		}
		time.Sleep(5 * time.Millisecond)
	}
	idle := func(when string) {
		for _, node := range []*troupe.Node{a, b} {
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				ws, err := node.Workers()
				if err != nil {
					t.Fatal(err)
				}
				busy := ""
				for _, w := range ws {
					if w.InFlight != 0 || w.Others < 0 || w.Foreign < 0 {
						busy += fmt.Sprintf(" %s in flight %d (others %d, foreign %d)", w.ID, w.InFlight, w.Others, w.Foreign)
					}
				}
				if busy == "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s, node %s counts on idle workers:%s", when, node.ID(), busy)
				}
			}
		}
	}
	idle("after the lost job")
	const n = 200
	for i := range n {
		f.submit(echoReq("after2-" + strconv.Itoa(i)))
	}
	for i := range n {
		f.waitStateWithin("after2-"+strconv.Itoa(i), jobstate.StateSucceeded, 60*time.Second)
	}
	idle("after the later jobs")
	if m := most.Load(); m > 2 {
		t.Fatalf("the pool ran %d jobs at once on its 2 slots", m)
	}
}

// TestAWaitBeforeTheRecordIsItsOwnStepInTheHistory: a job that waited for
// room with no record has a history that starts at its submit and shows
// the wait as its own step — PENDING at the submit, SCHEDULED
// pool_overloaded from when the wait began, DISPATCHED when it was placed —
// though all three were written in one create (issue 27, deliverable 1).
func TestAWaitBeforeTheRecordIsItsOwnStepInTheHistory(t *testing.T) {
	t.Parallel()
	f, g, w := oneJobWaiting(t, "hist-1", "hist-2")
	queued := time.Now()
	time.Sleep(300 * time.Millisecond) // the wait the history must show (hist-1 holds the slot)
	g.open("hist-1", true)
	if got := w.waitGot(5 * time.Second); got != "hist-2" {
		t.Fatalf("got %s, want hist-2", got)
	}
	placed := time.Now()
	g.open("hist-2", true)
	r := f.waitState("hist-2", jobstate.StateSucceeded)
	h := r.History
	if len(h) < 3 || h[0].To != jobstate.StatePending || h[1].To != jobstate.StateScheduled ||
		h[1].Reason != jobstate.ReasonPoolOverloaded || h[2].To != jobstate.StateDispatched {
		t.Fatalf("history %+v; want PENDING, SCHEDULED pool_overloaded, DISPATCHED", h)
	}
	if h[0].At.After(queued) || h[1].At.After(queued) {
		t.Fatalf("history %+v: PENDING and SCHEDULED dated after the job was seen waiting (%v)", h, queued)
	}
	if wait := h[2].At.Sub(h[1].At); wait < 300*time.Millisecond || h[2].At.After(placed) {
		t.Fatalf("SCHEDULED step lasted %v; the job waited at least 300 ms", wait)
	}
}

// tenantPolicy throttles tenant "slow", is unavailable to tenant "down",
// and allows the rest.
type tenantPolicy struct{}

func (tenantPolicy) Check(_ context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	switch req.GetTenant() {
	case "slow":
		return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_THROTTLE}, nil
	case "down":
		return nil, errors.New("policy unavailable")
	}
	return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}, nil
}

// TestWaitsOnThePolicyLeaveTheNodesAdmissions: jobs waiting on a THROTTLE
// or on an unavailable policy (created PENDING, their submits acked) do not
// keep their places in MaxAdmitting either (issue 27, item 2).
func TestWaitsOnThePolicyLeaveTheNodesAdmissions(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		noBackoff(c)
		c.Tuning.MaxAdmitting = 4
		c.Tuning.AdmissionHold = time.Hour
		c.Policy = tenantPolicy{}
	})
	w := startCapWorker(t, f.env.NATS, f.subj, "wide", 50, time.Hour, nil)
	f.waitWorkers(1)
	for i := range 8 {
		r := echoReq("pol-" + strconv.Itoa(i))
		r.TenantId = []string{"slow", "down"}[i%2]
		f.submit(r)
	}
	for i := range 8 {
		f.waitState("pol-"+strconv.Itoa(i), jobstate.StatePending)
	}
	f.untilAdmitting(0)
	f.submit(echoReq("pol-other"))
	if got := w.waitGot(10 * time.Second); got != "pol-other" {
		t.Fatalf("got %s, want pol-other", got)
	}
	f.waitState("pol-other", jobstate.StateSucceeded)
}

// TestAWaitBeforeTheRecordIsItsOwnSpan: the OpenTelemetry spans of a job
// that waited for room with no record follow its history: a SCHEDULED span
// with the wait's reason from when the wait began, lasting the wait (not a
// long PENDING span that reads like a slow policy check).
func TestAWaitBeforeTheRecordIsItsOwnSpan(t *testing.T) {
	t.Parallel()
	recv, addr := startOTLPReceiver(t)
	f := newFixture(t, func(c *troupe.Config) {
		noBackoff(c)
		c.Tuning.CapacityGrace = time.Hour
		c.OTLPEndpoint = addr
	})
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "single", 1, time.Hour, g.wait)
	f.waitWorkers(1)
	f.submit(echoReq("span-1"))
	w.waitGot(5 * time.Second)
	f.submit(echoReq("span-2"))
	f.waitQueued(1)
	time.Sleep(300 * time.Millisecond) // the wait the spans must show (span-1 holds the slot)
	g.open("span-1", true)
	if got := w.waitGot(5 * time.Second); got != "span-2" {
		t.Fatalf("got %s, want span-2", got)
	}
	g.open("span-2", true)
	f.waitState("span-2", jobstate.StateSucceeded)
	f.stopAndFlush()
	_, states := recv.jobSpans("span-2")
	by := map[string]*tracepb.Span{}
	for _, s := range states {
		by[s.GetName()] = s
	}
	pending, scheduled := by[tracing.SpanStatePrefix+string(jobstate.StatePending)], by[tracing.SpanStatePrefix+string(jobstate.StateScheduled)]
	if pending == nil || scheduled == nil {
		t.Fatalf("state spans %v; want PENDING and SCHEDULED", states)
	}
	if r := strAttr(scheduled.GetAttributes(), string(tracing.AttrTransition)); r != string(jobstate.ReasonPoolOverloaded) {
		t.Fatalf("SCHEDULED span reason %q, want pool_overloaded", r)
	}
	wait := time.Duration(scheduled.GetEndTimeUnixNano() - scheduled.GetStartTimeUnixNano())
	if wait < 300*time.Millisecond {
		t.Fatalf("SCHEDULED span lasted %v; the job waited at least 300 ms", wait)
	}
	if pend := time.Duration(pending.GetEndTimeUnixNano() - pending.GetStartTimeUnixNano()); pend >= wait {
		t.Fatalf("PENDING span %v, SCHEDULED %v: the wait is still shown as PENDING", pend, wait)
	}
}

// TestSpansOfAJobHeldInTheStreamStartAtItsSubmit: a job whose submit
// waited in the stream (the node at MaxAdmitting), then waited for room
// on the node, has a PENDING span from its submit's stored time — the
// record's sub field, where its history starts too — not from when a node
// took it, and its wait for room as its own SCHEDULED span with its
// reason; the job span begins with the PENDING span.
func TestSpansOfAJobHeldInTheStreamStartAtItsSubmit(t *testing.T) {
	t.Parallel()
	recv, addr := startOTLPReceiver(t)
	f := newFixture(t, func(c *troupe.Config) {
		noBackoff(c)
		c.Tuning.MaxAdmitting = 1
		c.Tuning.AdmissionHold = time.Hour
		c.Tuning.CapacityGrace = time.Hour
		c.OTLPEndpoint = addr
	})
	g := newJobGates()
	w := startCapWorker(t, f.env.NATS, f.subj, "single", 1, time.Hour, g.wait)
	f.waitWorkers(1)
	ctx := context.Background()
	waiting := func(id string) {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if wj, _ := f.node.WaitingJob(ctx, id); wj != nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never waited for room", id)
			}
		}
	}
	f.submit(echoReq("sp-a"))
	w.waitGot(5 * time.Second)
	f.submit(echoReq("sp-b"))
	waiting("sp-b")
	f.untilAdmitting(1)
	f.untilNoPulls()
	f.submit(echoReq("sp-c")) // held in the stream
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if n, _ := f.node.CountStates(ctx); n[jobstate.StateScheduled] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sp-c never counted SCHEDULED in the stream")
		}
	}
	if wj, _ := f.node.WaitingJob(ctx, "sp-c"); wj != nil {
		t.Fatal("sp-c was taken by the node, not held in the stream")
	}
	time.Sleep(300 * time.Millisecond) // the wait in the stream the spans must show
	opened := time.Now()               // no node has taken sp-c before this
	g.open("sp-a", true)
	if got := w.waitGot(5 * time.Second); got != "sp-b" {
		t.Fatalf("got %s, want sp-b", got)
	}
	waiting("sp-c")
	g.open("sp-b", true)
	if got := w.waitGot(5 * time.Second); got != "sp-c" {
		t.Fatalf("got %s, want sp-c", got)
	}
	g.open("sp-c", true)
	rec := f.waitState("sp-c", jobstate.StateSucceeded)
	f.stopAndFlush()

	sub, err := strconv.ParseInt(rec.Fields["sub"], 10, 64)
	if err != nil || sub <= 0 || !time.UnixMilli(sub).Before(opened) {
		t.Fatalf("record sub %q, want a time before %v", rec.Fields["sub"], opened)
	}
	if at := rec.History[0].At.UnixMilli(); at != sub {
		t.Fatalf("history starts at %d, want the submit's %d", at, sub)
	}
	jobs, states := recv.jobSpans("sp-c")
	by := map[string]*tracepb.Span{}
	for _, s := range states {
		by[s.GetName()] = s
	}
	pending, scheduled := by[tracing.SpanStatePrefix+string(jobstate.StatePending)], by[tracing.SpanStatePrefix+string(jobstate.StateScheduled)]
	if len(jobs) != 1 || pending == nil || scheduled == nil {
		t.Fatalf("job spans %d, state spans %v; want one job span, PENDING and SCHEDULED", len(jobs), states)
	}
	startMs := func(s *tracepb.Span) int64 { return int64(s.GetStartTimeUnixNano() / uint64(time.Millisecond)) }
	if got := startMs(pending); got != sub {
		t.Fatalf("PENDING span starts at %d, want the submit's stored time %d (%d ms later)", got, sub, got-sub)
	}
	t.Logf("sp-c: PENDING %v (submit to taken), SCHEDULED %v",
		time.Duration(pending.GetEndTimeUnixNano()-pending.GetStartTimeUnixNano()),
		time.Duration(scheduled.GetEndTimeUnixNano()-scheduled.GetStartTimeUnixNano()))
	if pend := time.Duration(pending.GetEndTimeUnixNano() - pending.GetStartTimeUnixNano()); pend < 300*time.Millisecond {
		t.Fatalf("PENDING span lasted %v; the submit waited in the stream at least 300 ms", pend)
	}
	if jobs[0].GetStartTimeUnixNano() > pending.GetStartTimeUnixNano() {
		t.Fatal("the job span starts after its PENDING span")
	}
	if r := strAttr(scheduled.GetAttributes(), string(tracing.AttrTransition)); r != string(jobstate.ReasonPoolOverloaded) {
		t.Fatalf("SCHEDULED span reason %q, want pool_overloaded", r)
	}
	if scheduled.GetStartTimeUnixNano() < pending.GetEndTimeUnixNano() || scheduled.GetStartTimeUnixNano() < uint64(opened.UnixNano()) {
		t.Fatal("the SCHEDULED span does not follow the PENDING span from when the node took the job")
	}
}
