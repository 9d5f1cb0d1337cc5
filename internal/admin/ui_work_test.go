package admin_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// pageWait bounds one condition on the page: the page polls every 3 s, and
// a job's way through the node on two busy cores takes a few seconds more.
const pageWait = 30 * time.Second

// demoHandler succeeds, except: a job labelled cordum.demo=fail fails (retryable
// status, with an error), step 2 of a workflow fails fatally (so the
// workflow rolls back), and a compensation succeeds.
func demoHandler(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
	switch {
	case req.Labels[saga.LabelIsCompensation] == "true":
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
	case req.Labels["cordum.demo"] == "fail":
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED, ErrorCode: "demo_fail",
			ErrorMessage: "boom: the job asked to fail"}
	case req.WorkflowId != "" && req.StepIndex == 2:
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED_FATAL, ErrorCode: "step_failed",
			ErrorMessage: "step 2 cannot go on"}
	}
	return worker.Echo(ctx, req)
}

// waitPaused waits until the node applies a pause or a resume of topic.
func (b *bundle) waitPaused(topic string, want bool) {
	b.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if inspect.Of(b.node).PoolConfig().Paused[topic] == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.t.Fatalf("node never applied paused=%v to %s", want, topic)
}

// postJob submits a job through the API as JSON (with a payload).
func postJob(t *testing.T, base, body string) {
	t.Helper()
	res, err := http.Post(base+"/v1/jobs", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusAccepted {
		msg, _ := io.ReadAll(res.Body)
		t.Fatalf("submit: %s %s", res.Status, msg)
	}
}

func labelled(id string, labels map[string]string) *capv1.JobRequest {
	r := echoReq(id, "acme")
	r.Labels = labels
	return r
}

// TestDashboardWorkflows does an operator's work through the dashboard in
// headless Chromium against a real node (labels under cordum. describe a
// job without constraining its placement): filter the job list by topic,
// label, state, tenant, worker and time; open a failed job and read its
// payload and attempts; retry it; pause a pool and see a job wait
// pool_paused; bulk-cancel the jobs a filter matches; resume the pool;
// bulk-retry them; see the charts drawn; open a workflow that rolled back.
// It ends with a screenshot.
func TestDashboardWorkflows(t *testing.T) {
	bin := findChromium()
	if bin == "" {
		t.Skip("chromium is not installed (Debian: apt-get install chromium; or set TROUPE_CHROMIUM): dashboard not tested")
	}
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	c := b.client("")
	b.startWorker("w1", demoHandler)

	submit := func(r *capv1.JobRequest) {
		t.Helper()
		if _, err := c.Submit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	submit(labelled("job-w-ok", map[string]string{"cordum.team": "blue"}))
	// The failed job carries a payload, stored by the API as its input.
	postJob(t, b.base, `{"job_id": "job-w-fail", "topic": "job.echo", "tenant_id": "acme",
		"labels": {"cordum.demo": "fail"}, "payload": {"order": 4217, "items": ["tea", "cups"]}}`)
	submit(&capv1.JobRequest{JobId: "job-w-lost", Topic: "job.unmapped", TenantId: "acme"})
	const wf = "wf-ui-1"
	for i := int32(0); i < 3; i++ {
		s := echoReq(fmt.Sprintf("%s-s%d", wf, i), "acme")
		s.WorkflowId, s.StepIndex = wf, i
		s.Compensation = &capv1.Compensation{Topic: "job.echo", Capability: "undo"}
		submit(s)
		want := "SUCCEEDED"
		if i == 2 {
			want = "FAILED"
		}
		b.waitState(c, s.JobId, want)
	}
	b.waitState(c, "job-w-ok", "SUCCEEDED")
	b.waitState(c, "job-w-fail", "FAILED")
	b.waitState(c, "job-w-lost", "FAILED")

	br := startBrowser(t, bin)
	br.navigate(t, b.base+"/ui/")
	br.waitFor(t, "the first refresh", `document.body.dataset.loaded === "true"`, pageWait)
	var firstMs float64
	if err := br.eval(`performance.now()`, &firstMs); err == nil {
		t.Logf("the page had drawn its first refresh within %.0f ms of starting to load", firstMs) // a figure, not a bound
	}

	// filter by topic, label and time
	t.Log("step: filter by topic, label and time")
	{
		br.do(t, "fill in the filter", `const f = document.getElementById("filter");
			f.elements.topic.value = "job.unmapped"; f.requestSubmit();`)
		br.waitFor(t, "the filtered list", `document.getElementById("jobs-panel").dataset.filter === "topic=job.unmapped" &&
			document.querySelector('#jobs tr[data-job-id="job-w-lost"]') &&
			!document.querySelector('#jobs tr[data-job-id="job-w-ok"]')`, pageWait)
		if h := br.waitFor(t, "the fragment", `location.hash`, pageWait); !strings.Contains(h, "topic=job.unmapped") {
			t.Errorf("fragment %q does not keep the filter", h)
		}
		br.do(t, "filter by label and state", `const f = document.getElementById("filter");
			f.elements.topic.value = ""; f.elements.label.value = "cordum.team=blue"; f.elements.state.value = "SUCCEEDED";
			f.requestSubmit();`)
		br.waitFor(t, "the labelled job alone", `document.getElementById("jobs-panel").dataset.rows === "1" &&
			document.querySelector('#jobs tr[data-job-id="job-w-ok"]')`, pageWait)
		br.do(t, "filter by tenant and worker", `const f = document.getElementById("filter");
			f.elements.label.value = ""; f.elements.state.value = ""; f.elements.tenant.value = "acme"; f.elements.worker.value = "w1";
			f.requestSubmit();`)
		br.waitFor(t, "the jobs w1 ran", `document.getElementById("jobs-panel").dataset.filter === "tenant=acme&worker=w1" &&
			document.querySelector('#jobs tr[data-job-id="job-w-ok"]') && !document.querySelector('#jobs tr[data-job-id="job-w-lost"]')`, pageWait)
		// Times as a person types them (local, to the minute).
		setSince := func(offset string) {
			br.do(t, "filter by time", `const f = document.getElementById("filter");
				const d = new Date(Date.now() + (`+offset+`)), p = n => String(n).padStart(2, "0");
				f.elements.tenant.value = ""; f.elements.worker.value = "";
				f.elements.since.value = d.getFullYear() + "-" + p(d.getMonth() + 1) + "-" + p(d.getDate()) + "T" + p(d.getHours()) + ":" + p(d.getMinutes());
				f.requestSubmit();`)
		}
		setSince("-3600e3")
		br.waitFor(t, "the jobs created in the last hour", `document.getElementById("jobs-panel").dataset.filter.startsWith("since=") &&
			document.querySelector('#jobs tr[data-job-id="job-w-ok"]')`, pageWait)
		setSince("3600e3")
		br.waitFor(t, "no job created in the next hour", `document.getElementById("jobs-panel").dataset.rows === "0" &&
			!document.querySelector('#jobs tr[data-job-id="job-w-ok"]')`, pageWait)
		br.do(t, "clear the filter", `document.getElementById("filter-clear").click()`)
		br.waitFor(t, "the whole list", `document.getElementById("jobs-panel").dataset.filter === "" &&
			document.querySelector('#jobs tr[data-job-id="job-w-fail"]')`, pageWait)
	}

	// job detail: payload and attempts
	t.Log("step: job detail: payload and attempts")
	{
		br.do(t, "open the failed job", `document.querySelector('#jobs tr[data-job-id="job-w-fail"] a').click()`)
		br.waitFor(t, "the job panel", `document.getElementById("job-panel").dataset.state === "FAILED" &&
			document.getElementById("job-panel").dataset.jobId === "job-w-fail"`, pageWait)
		att := br.waitFor(t, "the attempt with its error", `(() => { const r = document.querySelector('#attempts tr[data-attempt="1"]');
			return r && r.textContent; })()`, pageWait)
		if !strings.Contains(att, "w1") || !strings.Contains(att, "boom: the job asked to fail") {
			t.Errorf("attempt row %q lacks the worker or the error", att)
		}
		in := br.waitFor(t, "the input payload", `document.getElementById("job-input").dataset.present === "true" &&
			document.getElementById("job-input").textContent`, pageWait)
		if !strings.Contains(in, "ctx:job-w-fail") || !strings.Contains(in, `"order": 4217`) || !strings.Contains(in, `"cups"`) {
			t.Errorf("input box %q lacks the job's pointer or its payload", in)
		}
	}

	// retry a failed job
	t.Log("step: retry a failed job")
	{
		br.do(t, "retry", `document.querySelector('#job-actions button[data-action="retry"]').click()`)
		id := br.waitFor(t, "the new job opened", `(() => { const p = document.getElementById("job-panel");
			return p.dataset.jobId !== "job-w-fail" && p.dataset.jobId; })()`, pageWait)
		j := b.waitState(c, id, "FAILED") // the new job runs and fails as its original did
		if j.RetryOf != "job-w-fail" || j.Reason != "worker_failed" || j.Worker != "w1" {
			t.Errorf("job %s: retry_of %q, ended %s on worker %q; want a retry of job-w-fail run by w1 (worker_failed)",
				id, j.RetryOf, j.Reason, j.Worker)
		}
		br.waitFor(t, "the retry's link to its original", `[...document.querySelectorAll("#job-meta a")].some(a => a.textContent === "job-w-fail")`, pageWait)
		br.waitFor(t, "the retry's input, its original's payload", `document.getElementById("job-input").textContent.includes('"order": 4217')`, pageWait)
	}

	// pause a pool, bulk cancel, resume
	t.Log("step: pause a pool, bulk cancel, resume")
	{
		br.do(t, "pause job.echo", `document.querySelector('#topics tr[data-topic="job.echo"] button').click()`)
		br.waitFor(t, "the topic paused", `document.querySelector('#topics tr[data-topic="job.echo"]').dataset.paused === "true"`, pageWait)
		b.waitPaused("job.echo", true) // the node has it (the call applies it before answering)
		submit(labelled("job-w-wait", map[string]string{"cordum.team": "red"}))
		for i := 0; i < 3; i++ {
			submit(labelled(fmt.Sprintf("job-w-batch-%d", i), map[string]string{"cordum.batch": "b1"}))
		}
		br.navigate(t, b.base+"/ui/#job=job-w-wait")
		br.waitFor(t, "the waiting job", `(() => { const w = document.getElementById("job-wait");
			return !w.hidden && w.dataset.reason === "pool_paused" &&
				document.getElementById("job-panel").dataset.state === "SCHEDULED"; })()`, pageWait)
		if note := br.waitFor(t, "the trace note", `document.getElementById("trace-note").textContent || "-"`, pageWait); strings.Contains(note, "not found") {
			t.Errorf("a waiting job's trace says %q", note)
		}

		br.do(t, "filter by id", `const f = document.getElementById("filter");
			f.elements.q.value = "job-w-batch-"; f.requestSubmit();`)
		br.waitFor(t, "the batch listed", `document.querySelectorAll('#jobs tr[data-job-id^="job-w-batch-"]').length === 3`, pageWait)
		br.do(t, "ask to cancel them", `document.getElementById("bulk-cancel").click()`)
		br.waitFor(t, "the confirmation", `!document.getElementById("bulk-confirm").hidden`, pageWait)
		br.do(t, "confirm", `document.getElementById("bulk-go").click()`)
		done := br.waitFor(t, "the bulk result", `document.getElementById("bulk-result").dataset.done`, pageWait)
		if done != "3" {
			t.Errorf("bulk cancel did %s jobs, want 3: %s", done, br.waitFor(t, "the bulk result", `document.getElementById("bulk-result").textContent`, pageWait))
		}
		for i := 0; i < 3; i++ {
			b.waitState(c, fmt.Sprintf("job-w-batch-%d", i), "CANCELLED")
		}
		if j, err := c.Job(ctx, "job-w-wait"); err != nil || j.State != "SCHEDULED" {
			t.Errorf("job-w-wait, outside the filter: %+v %v, want still SCHEDULED", j.State, err)
		}

		br.do(t, "resume job.echo", `document.querySelector('#topics tr[data-topic="job.echo"] button').click()`)
		br.waitFor(t, "the topic resumed", `document.querySelector('#topics tr[data-topic="job.echo"]').dataset.paused === "false"`, pageWait)
		b.waitPaused("job.echo", false)
		b.waitState(c, "job-w-wait", "SUCCEEDED")

		br.do(t, "filter the cancelled batch", `const f = document.getElementById("filter");
			f.elements.state.value = "CANCELLED"; f.requestSubmit();`)
		br.waitFor(t, "the cancelled batch listed", `document.getElementById("jobs-panel").dataset.filter === "state=CANCELLED&q=job-w-batch-" &&
			document.getElementById("jobs-panel").dataset.rows === "3"`, pageWait)
		br.do(t, "ask to retry them", `document.getElementById("bulk-retry").click()`)
		br.waitFor(t, "the confirmation", `!document.getElementById("bulk-confirm").hidden`, pageWait)
		br.do(t, "confirm", `document.getElementById("bulk-go").click()`)
		if done := br.waitFor(t, "the bulk retry's result", `(() => { const r = document.getElementById("bulk-result");
			return r.dataset.action === "retry" && r.dataset.done; })()`, pageWait); done != "3" {
			t.Errorf("bulk retry did %s jobs, want 3", done)
		}
		for i := 0; i < 3; i++ {
			b.waitState(c, fmt.Sprintf("job-w-batch-%d-retry1", i), "SUCCEEDED")
		}
		br.do(t, "clear the filter", `document.getElementById("filter-clear").click()`)
		br.navigate(t, b.base+"/ui/#job=job-w-wait")
		br.waitFor(t, "the job done", `document.getElementById("job-panel").dataset.state === "SUCCEEDED"`, pageWait)
	}

	// charts
	t.Log("step: charts")
	{
		for _, id := range []string{"chart", "chart-depth", "chart-latency", "chart-failures"} {
			br.waitFor(t, "a line in "+id, `[...document.querySelectorAll("#`+id+` path")].some(p => /^M[0-9.]+,[0-9.]+/.test(p.getAttribute("d") || ""))`, pageWait)
		}
	}

	// workflow
	t.Log("step: workflow")
	{
		br.waitFor(t, "the workflow listed", `document.querySelector('#sagas tr[data-saga="`+wf+`"]')`, pageWait)
		br.navigate(t, b.base+"/ui/#saga="+wf)
		br.waitFor(t, "the rollback's outcome", `document.getElementById("saga").dataset.status === "completed"`, pageWait)
		steps := br.waitFor(t, "the steps and their compensations", `(() => {
			const li = [...document.querySelectorAll("#saga-steps li[data-step]")];
			return li.length === 2 && li.every(x => x.dataset.compState === "SUCCEEDED") && li.map(x => x.dataset.step).join(",");
		})()`, pageWait)
		if steps != wf+"-s1,"+wf+"-s0" {
			t.Errorf("steps %q, want the stack newest first: %s-s1,%s-s0", steps, wf, wf)
		}
	}

	if errs := br.pageErrors(); len(errs) > 0 {
		t.Errorf("the page logged errors: %v", errs)
	}
	if t.Failed() {
		return
	}
	if err := os.MkdirAll(artifactsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	br.navigate(t, b.base+"/ui/#job=job-w-fail&saga="+wf)
	br.waitFor(t, "the failed job", `document.getElementById("job-panel").dataset.jobId === "job-w-fail" &&
		document.getElementById("job-panel").dataset.state === "FAILED" &&
		document.querySelector('#attempts tr[data-attempt="1"]') && document.getElementById("saga").dataset.status`, pageWait)
	br.do(t, "scroll to the top", `window.scrollTo(0, 0)`)
	shot := filepath.Join(artifactsDir, "dashboard-work.png")
	br.screenshot(t, shot)
	t.Logf("dashboard screenshot: %s", shot)
}

// TestDashboardShowsAnUnwrittenWait opens a job that waits for room in a
// full pool within its capacity grace (no record yet): the page says what
// it waits for and its place in the queue, and no panel reports the
// missing record as an error.
func TestDashboardShowsAnUnwrittenWait(t *testing.T) {
	bin := findChromium()
	if bin == "" {
		t.Skip("chromium is not installed (Debian: apt-get install chromium; or set TROUPE_CHROMIUM): dashboard not tested")
	}
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	c := b.client("")
	b.startWorker("w-full", hang) // max_parallel 4, never answers
	for i := range 4 {
		id := fmt.Sprintf("busy-%d", i)
		if _, err := c.Submit(ctx, echoReq(id, "acme")); err != nil {
			t.Fatal(err)
		}
		b.waitState(c, id, "DISPATCHED")
	}
	if _, err := c.Submit(ctx, echoReq("queued", "acme")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for j, err := c.Job(ctx, "queued"); err != nil || !j.Unwritten; j, err = c.Job(ctx, "queued") {
		if time.Now().After(deadline) {
			t.Fatalf("the job never waited unwritten: %+v %v", j, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	br := startBrowser(t, bin)
	br.navigate(t, b.base+"/ui/#job=queued")
	wait := br.waitFor(t, "the wait", `(() => { const w = document.getElementById("job-wait");
		return !w.hidden && w.dataset.reason === "pool_overloaded" &&
			document.getElementById("job-panel").dataset.state === "SCHEDULED" && w.textContent; })()`, pageWait)
	if !strings.Contains(wait, "0 jobs before it") || !strings.Contains(wait, "every worker of its pool is at its limit") {
		t.Errorf("the wait says %q; want the reason in words and the queue position", wait)
	}
	panel := br.waitFor(t, "the job panel's text", `document.getElementById("job-panel").textContent`, pageWait)
	if strings.Contains(panel, "not found") {
		t.Errorf("a waiting job's panel reports a missing record: %q", panel)
	}
	if errs := br.pageErrors(); len(errs) > 0 {
		t.Errorf("the page logged errors: %v", errs)
	}
	if err := os.MkdirAll(artifactsDir, 0o755); err == nil {
		br.screenshot(t, filepath.Join(artifactsDir, "dashboard-wait.png"))
	}
}

// TestDashboardWithATenantKey opens the page with a tenant's key handed
// over in the fragment: it lists that tenant's jobs only, hides what needs
// an all-tenant key (counts, charts, workflows, pausing), and drops the key
// from the address.
func TestDashboardWithATenantKey(t *testing.T) {
	bin := findChromium()
	if bin == "" {
		t.Skip("chromium is not installed (Debian: apt-get install chromium; or set TROUPE_CHROMIUM): dashboard not tested")
	}
	t.Parallel()
	b := setup(t, options{keys: testKeys})
	ctx := context.Background()
	b.startWorker("w1", worker.Echo)
	for key, id := range map[string]string{keyA: "job-of-a", keyB: "job-of-b"} {
		c := b.client(key)
		if _, err := c.Submit(ctx, echoReq(id, "")); err != nil {
			t.Fatal(err)
		}
		b.waitState(c, id, "SUCCEEDED")
	}

	br := startBrowser(t, bin)
	br.navigate(t, b.base+"/ui/#key="+keyA)
	br.waitFor(t, "tenant a's job", `document.querySelector('#jobs tr[data-job-id="job-of-a"]') &&
		document.querySelector('#topics tr[data-topic="job.echo"]')`, pageWait)
	var seen struct {
		OtherJob, Pause, Hash bool
		Hidden                []bool
	}
	if err := br.eval(`({
		OtherJob: !!document.querySelector('#jobs tr[data-job-id="job-of-b"]'),
		Pause: !!document.querySelector('#topics button'),
		Hash: location.hash.includes("key="),
		Hidden: ["states-panel", "series-panel", "sagas-panel"].map(id => document.getElementById(id).hidden),
	})`, &seen); err != nil {
		t.Fatal(err)
	}
	if seen.OtherJob || seen.Pause || seen.Hash || len(seen.Hidden) != 3 || !seen.Hidden[0] || !seen.Hidden[1] || !seen.Hidden[2] {
		t.Errorf("tenant a's page: %+v; want no job of b, no pause button, no key in the address, the all-tenant panels hidden", seen)
	}
	if errs := br.pageErrors(); len(errs) > 0 {
		t.Errorf("the page logged errors: %v", errs)
	}
}
