package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/schedule"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// A delayed submit is held (listed, no record) until its time, then runs
// as an ordinary job; a schedule's ticks run as ordinary jobs.
func TestScheduleNodeRunsDelayedAndScheduledJobs(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.startWorker("w1", true, nil, worker.Echo)
	ctx := context.Background()

	req := echoReq("later-1")
	req.Labels = map[string]string{schedule.LabelRunAfter: "1500ms"}
	f.submit(req)
	var held *schedule.Delayed
	for deadline := time.Now().Add(10 * time.Second); held == nil && time.Now().Before(deadline); {
		d, err := f.node.Schedules().GetDelayed(ctx, "later-1")
		if err == nil {
			held = d
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if held == nil {
		t.Fatal("the delayed submit was never held")
	}
	if _, err := f.node.Job(ctx, "later-1"); !errors.Is(err, store.ErrNotFound) && time.Now().Before(held.Due) {
		t.Fatalf("delayed job has a record before its time: %v", err)
	}
	r := f.waitState("later-1", jobstate.StateSucceeded)
	if r.Created.Before(held.Due) {
		t.Errorf("record created %s, before the due time %s", r.Created, held.Due)
	}
	if r.TraceID != "trace-later-1" {
		t.Errorf("trace id %q not kept", r.TraceID)
	}
	stored := &capv1.JobRequest{}
	if err := proto.Unmarshal(r.Request, stored); err != nil {
		t.Fatal(err)
	}
	if stored.GetMeta().GetLabels()[schedule.LabelDelayedUntil] == "" || stored.Labels[schedule.LabelRunAfter] != "" {
		t.Errorf("stored labels %v meta %v, want delayed_until in place of run_after", stored.Labels, stored.GetMeta())
	}

	// A malformed delay label: the submit is dead-lettered, invalid.
	bad := echoReq("later-bad")
	bad.Meta = &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAt: "tomorrow"}}
	f.submit(bad)
	e := f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == "later-bad" })
	if e.Reason != jobstate.ReasonInvalidRequest || !strings.Contains(e.Message, schedule.LabelRunAt) {
		t.Errorf("DLQ entry %+v, want invalid_request naming the label", e)
	}

	s := &schedule.Schedule{ID: "echo-every-second", Every: "1s", Topic: "job.echo"}
	if err := f.node.Schedules().Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	var last *schedule.Fired
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got, err := f.node.Schedules().Get(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Last != nil {
			last = got.Last
			break
		}
	}
	if last == nil {
		t.Fatal("the schedule never fired")
	}
	r = f.waitState(last.JobID, jobstate.StateSucceeded)
	if err := proto.Unmarshal(r.Request, stored); err != nil {
		t.Fatal(err)
	}
	if stored.GetMeta().GetLabels()[schedule.LabelSchedule] != s.ID || r.Created.Before(last.Tick) {
		t.Errorf("tick job: labels %v created %s, want the schedule's, at or after %s", stored.Labels, r.Created, last.Tick)
	}
	if err := f.node.Schedules().Delete(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// The schedule API: a tenant key creates schedules for its own tenant and
// sees and acts on its own schedules and delayed jobs only.
func TestScheduleAdminAPIIsTenantScoped(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	const allKey, acmeKey, betaKey = "sched-all-key-0123456789abc", "sched-acme-key-0123456789ab", "sched-beta-key-0123456789ab"
	url := startAdmin(t, f.node, map[string]string{allKey: admin.AllTenants, acmeKey: "acme", betaKey: "beta"})
	ctx := context.Background()
	all, acme, beta := admin.NewClient(url, allKey), admin.NewClient(url, acmeKey), admin.NewClient(url, betaKey)
	status := func(err error) int {
		var ae *admin.APIError
		if errors.As(err, &ae) {
			return ae.Status
		}
		return 0
	}

	s, err := acme.CreateSchedule(ctx, schedule.Schedule{ID: "acme-hourly", Cron: "@hourly", Topic: "job.echo"})
	if err != nil || s.Tenant != "acme" || s.NextTick == nil || s.CreatedBy == "" {
		t.Fatalf("create as acme: %+v %v", s, err)
	}
	if _, err := acme.CreateSchedule(ctx, schedule.Schedule{ID: "x", Every: "1m", Topic: "job.echo", Tenant: "beta"}); status(err) != 403 {
		t.Fatalf("acme creating for beta: %v, want 403", err)
	}
	if _, err := acme.CreateSchedule(ctx, schedule.Schedule{ID: "acme-hourly", Every: "1m", Topic: "job.echo"}); status(err) != 409 {
		t.Fatalf("second create: %v, want 409", err)
	}
	if _, err := acme.CreateSchedule(ctx, schedule.Schedule{ID: "bad", Cron: "* * *", Topic: "job.echo"}); status(err) != 400 {
		t.Fatalf("bad cron: %v, want 400", err)
	}
	if l, err := beta.Schedules(ctx); err != nil || len(l.Schedules) != 0 {
		t.Fatalf("beta's list: %+v %v, want empty", l, err)
	}
	if _, err := beta.Schedule(ctx, "acme-hourly"); status(err) != 404 {
		t.Fatalf("beta reading acme's: %v, want 404", err)
	}
	if _, err := beta.PauseSchedule(ctx, "acme-hourly", true); status(err) != 404 {
		t.Fatalf("beta pausing acme's: %v, want 404", err)
	}
	if err := beta.DeleteSchedule(ctx, "acme-hourly"); status(err) != 404 {
		t.Fatalf("beta deleting acme's: %v, want 404", err)
	}
	if l, err := all.Schedules(ctx); err != nil || len(l.Schedules) != 1 {
		t.Fatalf("all-tenant list: %+v %v", l, err)
	}
	if got, err := acme.PauseSchedule(ctx, "acme-hourly", true); err != nil || !got.Paused || got.NextTick != nil {
		t.Fatalf("pause: %+v %v", got, err)
	}
	if got, err := acme.PauseSchedule(ctx, "acme-hourly", false); err != nil || got.Paused || got.NextTick == nil {
		t.Fatalf("resume: %+v %v", got, err)
	}

	req := echoReq("acme-later")
	req.TenantId = "acme"
	req.Meta = &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAfter: "1h"}}
	f.submit(req)
	var l admin.DelayedList
	for deadline := time.Now().Add(10 * time.Second); len(l.Delayed) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the delayed job was never listed")
		}
		if l, err = acme.Delayed(ctx, 10); err != nil {
			t.Fatal(err)
		}
	}
	if l, err := beta.Delayed(ctx, 10); err != nil || len(l.Delayed) != 0 {
		t.Fatalf("beta's delayed: %+v %v, want none", l, err)
	}
	if err := beta.DeleteDelayed(ctx, "acme-later"); status(err) != 404 {
		t.Fatalf("beta deleting acme's delayed job: %v, want 404", err)
	}
	if err := acme.DeleteDelayed(ctx, "acme-later"); err != nil {
		t.Fatal(err)
	}
	if err := acme.DeleteSchedule(ctx, "acme-hourly"); err != nil {
		t.Fatal(err)
	}
}

// TestScheduleBenchNodeDelayedBurst: N jobs submitted to a node with one
// troupe.run_at; how late after it each job's record was created (the
// intake held it, the ticker submitted it, a node took it and wrote it).
// TROUPE_BENCH=1 only (a timing); TROUPE_BENCH_JOBS sets N (default 1000).
//
//	TROUPE_BENCH=1 go test -count=1 -v -run TestScheduleBenchNodeDelayedBurst .
func TestScheduleBenchNodeDelayedBurst(t *testing.T) {
	if os.Getenv("TROUPE_BENCH") != "1" {
		t.Skip("a timing: set TROUPE_BENCH=1")
	}
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("TROUPE_BENCH_JOBS")); err == nil && v > 0 {
		n = v
	}
	f := newFixture(t, nil)
	ctx := context.Background()
	// The ticker's submits as the bus carries them: a plain subscriber to
	// the submit subject sees each when it is published.
	var mu sync.Mutex
	fired := map[string]time.Time{}
	sub, err := f.env.NATS.Subscribe(f.subj.Submit, func(m *nats.Msg) {
		at := time.Now()
		pkt, err := bus.Decode(m.Data)
		if err != nil || pkt.GetJobRequest().GetMeta().GetLabels()[schedule.LabelDelayedUntil] == "" {
			return
		}
		mu.Lock()
		fired[pkt.GetJobRequest().JobId] = at
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	due := time.Now().Add(5 * time.Second).Truncate(time.Millisecond)
	var acks []jetstream.PubAckFuture
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("nburst-%05d", i)
		req := echoReq(ids[i])
		req.Meta = &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAt: due.Format(time.RFC3339Nano)}}
		data, err := bus.EncodeRequest(ids[i], "bench", req)
		if err != nil {
			t.Fatal(err)
		}
		a, err := f.js.PublishAsync(f.subj.Submit, data)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, a)
	}
	for _, a := range acks {
		select {
		case <-a.Ok():
		case err := <-a.Err():
			t.Fatal(err)
		}
	}
	if time.Now().After(due) {
		t.Fatal("submitting took past the due time; raise the lead")
	}
	// A plain job published at the due time, for comparison.
	time.Sleep(time.Until(due))
	plain := echoReq("nburst-plain")
	f.submit(plain)
	plainAt := time.Now()
	lags := make([]time.Duration, 0, n)
	for _, id := range ids {
		var r *troupe.Job
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			var err error
			if r, err = f.node.Job(ctx, id); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never got a record", id)
			}
		}
		if r.Created.Before(due) {
			t.Errorf("%s created %s before its time", id, due.Sub(r.Created))
		}
		lags = append(lags, r.Created.Sub(due))
	}
	slices.Sort(lags)
	q := func(p float64) time.Duration { return lags[min(len(lags)-1, int(p*float64(len(lags))))] }
	mu.Lock()
	var fl []time.Duration
	for _, at := range fired {
		fl = append(fl, at.Sub(due))
	}
	mu.Unlock()
	slices.Sort(fl)
	if len(fl) != n {
		t.Errorf("the subscriber saw %d of the %d submits", len(fl), n)
	}
	fq := func(p float64) time.Duration { return fl[min(len(fl)-1, int(p*float64(len(fl))))] }
	t.Logf("%d delayed jobs: published by the ticker after due p50 %s p99 %s max %s (min %s)", len(fl), fq(0.5), fq(0.99),
		fl[len(fl)-1], fl[0])
	if r, err := f.node.Job(ctx, "nburst-plain"); err == nil {
		t.Logf("a plain job published at the due time: record created %s after its publish", r.Created.Sub(plainAt))
	}
	mfs, _ := f.node.Metrics().Gather()
	submitLag := ""
	for _, mf := range mfs {
		if mf.GetName() == "troupe_schedule_submit_lag_seconds" {
			h := mf.Metric[0].GetHistogram()
			submitLag = fmt.Sprintf("%d submitted, mean %.1f ms after due", h.GetSampleCount(), 1000*h.GetSampleSum()/float64(h.GetSampleCount()))
		}
	}
	t.Logf("%d delayed jobs due at one instant through a node: record created after due p50 %s p99 %s max %s; ticker: %s",
		n, q(0.5), q(0.99), lags[len(lags)-1], submitLag)
}

// With signatures verified, the ticker's submits (a delayed job's, a
// tick's) are signed as the node and accepted.
func TestScheduleSignedNodeSubmitsAsItself(t *testing.T) {
	t.Parallel()
	s := newSigSetup(t, "sched")
	f := newFixture(t, s.nodeConfig(true))
	s.startWorker(f, s.keys, nil, worker.Echo)
	ctx := context.Background()

	req := echoReq("signed-later")
	req.Meta = &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAfter: "300ms"}}
	f.signedSubmit(s.client, "client", req)
	f.waitState("signed-later", jobstate.StateSucceeded)

	sc := &schedule.Schedule{ID: "signed-tick", Every: "1s", Topic: "job.echo"}
	if err := f.node.Schedules().Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	var last *schedule.Fired
	for deadline := time.Now().Add(15 * time.Second); last == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the schedule never fired")
		}
		got, err := f.node.Schedules().Get(ctx, sc.ID)
		if err != nil {
			t.Fatal(err)
		}
		last = got.Last
	}
	f.waitState(last.JobID, jobstate.StateSucceeded)
	if err := f.node.Schedules().Delete(ctx, sc.ID); err != nil {
		t.Fatal(err)
	}
}

// A delayed job is a job before its time: GET /v1/jobs/{id} and the job
// list show it SCHEDULED, reason delayed, with its run_at, to its tenant
// only; its cancel removes it and it never runs; a job whose due time has
// come is cancelled as a job (CANCELLED once it has a record).
func TestScheduleDelayedJobIsAJobUntilItsTime(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.startWorker("w1", true, nil, worker.Echo)
	const allKey, acmeKey, betaKey = "sched-all-key-0123456789abd", "sched-acme-key-0123456789ac", "sched-beta-key-0123456789ac"
	url := startAdmin(t, f.node, map[string]string{allKey: admin.AllTenants, acmeKey: "acme", betaKey: "beta"})
	ctx := context.Background()
	all, acme, beta := admin.NewClient(url, allKey), admin.NewClient(url, acmeKey), admin.NewClient(url, betaKey)

	for _, id := range []string{"hold-1", "hold-2"} {
		req := echoReq(id)
		req.TenantId = "acme"
		req.Meta = &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAfter: "1h"}}
		f.submit(req)
	}
	var j admin.Job
	var err error
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if j, err = acme.Job(ctx, "hold-2"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the delayed job was never shown: %v", err)
		}
	}
	if j.State != string(jobstate.StateScheduled) || j.Reason != admin.DelayedReason || j.RunAt == nil ||
		time.Until(*j.RunAt) < 50*time.Minute || !j.Unwritten || j.Tenant != "acme" || j.Topic != "job.echo" {
		t.Fatalf("delayed job shown as %+v, want SCHEDULED delayed with its run_at", j)
	}
	if _, err := beta.Job(ctx, "hold-2"); err == nil {
		t.Fatal("another tenant's key sees the delayed job")
	}
	listed := func(c *admin.Client, f admin.JobFilter) []string {
		l, err := c.SearchJobs(ctx, f, 10, "")
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range l.Jobs {
			if s.Reason == admin.DelayedReason && s.RunAt != nil {
				ids = append(ids, s.ID)
			}
		}
		slices.Sort(ids)
		return ids
	}
	if got := listed(acme, admin.JobFilter{State: "SCHEDULED"}); !slices.Equal(got, []string{"hold-1", "hold-2"}) {
		t.Errorf("acme's SCHEDULED list shows delayed %v, want hold-1 hold-2", got)
	}
	if got := listed(all, admin.JobFilter{Topic: "job.other"}); len(got) != 0 {
		t.Errorf("a topic filter kept delayed %v", got)
	}
	if got := listed(beta, admin.JobFilter{}); len(got) != 0 {
		t.Errorf("beta's list shows acme's delayed %v", got)
	}
	// A page of one: the cursor walks the delayed jobs.
	p1, err := all.SearchJobs(ctx, admin.JobFilter{State: "SCHEDULED"}, 1, "")
	if err != nil || len(p1.Jobs) != 1 || p1.Next == "" {
		t.Fatalf("first page: %+v %v", p1, err)
	}
	p2, err := all.SearchJobs(ctx, admin.JobFilter{State: "SCHEDULED"}, 1, p1.Next)
	if err != nil || len(p2.Jobs) != 1 || p2.Jobs[0].ID == p1.Jobs[0].ID {
		t.Fatalf("second page: %+v %v (first %+v)", p2, err, p1)
	}

	if _, err := beta.Cancel(ctx, "hold-1", "", ""); err == nil {
		if _, gerr := f.node.Schedules().GetDelayed(ctx, "hold-1"); gerr != nil {
			t.Fatal("another tenant's cancel removed the delayed job")
		}
	}
	a, err := acme.Cancel(ctx, "hold-1", "not needed", "")
	if err != nil || a.Note != admin.CancelledDelayedNote {
		t.Fatalf("cancel: %+v %v, want the delayed job removed", a, err)
	}
	if _, err := acme.Job(ctx, "hold-1"); err == nil {
		t.Fatal("the cancelled delayed job is still shown")
	}
	if _, err := f.node.Schedules().GetDelayed(ctx, "hold-1"); !errors.Is(err, schedule.ErrNotFound) {
		t.Fatalf("the cancelled delayed job is still held: %v", err)
	}
	if got := listed(acme, admin.JobFilter{State: "SCHEDULED"}); !slices.Equal(got, []string{"hold-2"}) {
		t.Errorf("after the cancel, delayed listed %v, want hold-2", got)
	}
	// A bulk cancel reaches delayed jobs too.
	res, err := acme.Bulk(ctx, admin.BulkRequest{Action: "cancel", Filter: admin.JobFilter{State: "SCHEDULED", Q: "hold-"}})
	if err != nil || res.Done != 1 || len(res.Failed) != 0 {
		t.Fatalf("bulk cancel: %+v %v, want hold-2 cancelled", res, err)
	}
	if _, err := f.node.Schedules().GetDelayed(ctx, "hold-2"); !errors.Is(err, schedule.ErrNotFound) {
		t.Fatalf("the bulk-cancelled delayed job is still held: %v", err)
	}
}

// A CAP client's cancel on the bus of a delayed job not yet due removes it
// (its cancel mark alone would expire long before a far run_at).
func TestScheduleDelayedJobCancelledOnTheBusIsRemoved(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()
	req := echoReq("bus-later")
	req.Meta = &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAfter: "200h"}}
	f.submit(req)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := f.node.Schedules().GetDelayed(ctx, "bus-later"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the delayed submit was never held")
		}
	}
	data, err := bus.EncodeCancel("trace-bus-later", "test-client", &capv1.JobCancel{JobId: "bus-later", Reason: "not needed",
		RequestedBy: "test-client"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(ctx, f.subj.Cancel, data); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := f.node.Schedules().GetDelayed(ctx, "bus-later")
		if errors.Is(err, schedule.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancel never removed the delayed job: %v", err)
		}
	}
}
