package admin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/schedule"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The dashboard lists schedules with their next tick and pauses them, lists
// delayed jobs with their run-at, opens one as a SCHEDULED job waiting for
// its time, and cancels it from the list.
func TestScheduleDashboardShowsSchedulesAndDelayedJobs(t *testing.T) {
	bin := findChromium()
	if bin == "" {
		t.Skip("chromium is not installed (Debian: apt-get install chromium; or set TROUPE_CHROMIUM): dashboard not tested")
	}
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	c := b.client("")
	if _, err := c.CreateSchedule(ctx, schedule.Schedule{ID: "nightly", Cron: "0 3 * * *", Topic: "job.echo"}); err != nil {
		t.Fatal(err)
	}
	req := &capv1.JobRequest{JobId: "later-ui", Topic: "job.echo", TenantId: "acme",
		Meta: &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAfter: "2h"}}}
	if _, err := c.Submit(ctx, req); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for j, err := c.Job(ctx, "later-ui"); err != nil || j.RunAt == nil; j, err = c.Job(ctx, "later-ui") {
		if time.Now().After(deadline) {
			t.Fatalf("the delayed job was never held: %+v %v", j, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	br := startBrowser(t, bin)
	br.navigate(t, b.base+"/ui/#job=later-ui")
	next := br.waitFor(t, "the schedule's next tick", `(() => { const r = document.querySelector('#schedules tr[data-schedule="nightly"]');
		return r && r.dataset.paused === "false" && r.querySelector("td.next").textContent; })()`, pageWait)
	if !strings.Contains(next, "in ") {
		t.Errorf("next tick shown as %q, want a time and how long until it", next)
	}
	runAt := br.waitFor(t, "the delayed job", `(() => { const r = document.querySelector('#delayed tr[data-job="later-ui"]');
		return r && r.querySelector("td.run-at").textContent; })()`, pageWait)
	if !strings.Contains(runAt, "in 2h") && !strings.Contains(runAt, "in 1h") {
		t.Errorf("run-at shown as %q, want about 2h ahead", runAt)
	}
	wait := br.waitFor(t, "the job's wait", `(() => { const w = document.getElementById("job-wait");
		return !w.hidden && w.dataset.reason === "delayed" &&
			document.getElementById("job-panel").dataset.state === "SCHEDULED" && w.textContent; })()`, pageWait)
	if !strings.Contains(wait, "delayed: submitted at") {
		t.Errorf("the job's wait says %q, want its run-at", wait)
	}
	br.do(t, "pause the schedule", `Array.from(document.querySelectorAll('#schedules tr[data-schedule="nightly"] button'))
		.find(b => b.textContent === "Pause").click();`)
	br.waitFor(t, "the schedule paused", `(() => { const r = document.querySelector('#schedules tr[data-schedule="nightly"]');
		return r && r.dataset.paused === "true"; })()`, pageWait)
	if s, err := c.Schedule(ctx, "nightly"); err != nil || !s.Paused {
		t.Fatalf("after the click: %+v %v, want paused", s, err)
	}
	br.do(t, "cancel the delayed job", `Array.from(document.querySelectorAll('#delayed tr[data-job="later-ui"] button'))
		.find(b => b.textContent === "Cancel").click();`)
	br.waitFor(t, "the delayed job gone", `!document.querySelector('#delayed tr[data-job="later-ui"]') &&
		document.querySelector('#delayed tbody').textContent.includes("no delayed jobs")`, pageWait)
	if _, err := c.Job(ctx, "later-ui"); err == nil {
		t.Fatal("the cancelled delayed job is still shown by the API")
	}
	if errs := br.pageErrors(); len(errs) > 0 {
		t.Errorf("the page logged errors: %v", errs)
	}
}
