package admin_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// artifactsDir keeps what a test leaves for people to look at (the
// dashboard screenshot). It is not a fixture: nothing reads it back.
const artifactsDir = "testdata/artifacts"

// chromiumTimeout bounds one headless run; a cold start on two busy cores
// takes a few seconds, the page's virtual time budget a few more.
const chromiumTimeout = 90 * time.Second

// findChromium returns Debian's chromium (or TROUPE_CHROMIUM), "" if none.
func findChromium() string {
	if p := os.Getenv("TROUPE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// headless runs chromium once against url with extra flags and returns its
// standard output; the test fails if chromium does.
func headless(t *testing.T, bin, url string, extra ...string) []byte {
	t.Helper()
	out, err := runHeadless(t, bin, url, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func runHeadless(t *testing.T, bin, url string, extra ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), chromiumTimeout)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
		"--disable-dev-shm-usage", "--hide-scrollbars", "--user-data-dir=" + t.TempDir(),
		// Let the page run its first polls (fetches pause virtual time, so
		// this is page time, not a sleep).
		"--virtual-time-budget=8000"}, extra...)
	args = append(args, url)
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("chromium %v: %v\nstderr:\n%s", extra, err, errb.String())
	}
	return out.Bytes(), nil
}

// TestDashboardShowsSubmittedJobs loads /ui in headless Chromium against a
// real node with a worker, and checks that the jobs submitted appear with
// their states, then keeps a screenshot under testdata/artifacts.
func TestDashboardShowsSubmittedJobs(t *testing.T) {
	bin := findChromium()
	if bin == "" {
		t.Skip("chromium is not installed (Debian: apt-get install chromium; or set TROUPE_CHROMIUM): dashboard not tested")
	}
	t.Parallel()
	b := setup(t, options{node: func(c *troupe.Config) { c.Policy = labelPolicy{} }})
	ctx := context.Background()
	c := b.client("")
	b.startWorker("w1", worker.Echo)
	b.startWorker("w2", worker.Sleep(200*time.Millisecond))

	if _, err := c.Submit(ctx, echoReq("job-ui-1", "acme")); err != nil {
		t.Fatal(err)
	}
	b.waitState(c, "job-ui-1", "SUCCEEDED")
	held := echoReq("job-ui-approval", "acme")
	held.Labels = map[string]string{"cordum.policy": "approve"}
	if _, err := c.Submit(ctx, held); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, &capv1.JobRequest{JobId: "job-ui-lost", Topic: "job.unmapped", TenantId: "acme"}); err != nil {
		t.Fatal(err)
	}
	b.waitState(c, "job-ui-approval", "APPROVAL_REQUIRED")
	b.waitState(c, "job-ui-lost", "FAILED")

	// Keep some work flowing while the page polls, so throughput has a
	// shape; few enough jobs that the page's 50 most recent still hold the
	// ones checked below.
	const background = 20
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < background; i++ {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			_, _ = c.Submit(ctx, &capv1.JobRequest{Topic: "job.echo", TenantId: "acme"})
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	url := b.base + "/ui/#job=job-ui-1"
	dom := headless(t, bin, url, "--dump-dom")
	for what, re := range map[string]*regexp.Regexp{
		"job row in SUCCEEDED":      regexp.MustCompile(`<tr data-job-id="job-ui-1" data-state="SUCCEEDED">`),
		"job row waiting approval":  regexp.MustCompile(`<tr data-job-id="job-ui-approval" data-state="APPROVAL_REQUIRED">`),
		"job panel in SUCCEEDED":    regexp.MustCompile(`<section id="job-panel"[^>]*data-job-id="job-ui-1" data-state="SUCCEEDED"`),
		"timeline reaches the end":  regexp.MustCompile(`<li class="st-SUCCEEDED" data-state="SUCCEEDED">`),
		"SUCCEEDED tile counts":     regexp.MustCompile(`data-state="SUCCEEDED" data-count="[1-9][0-9]*"`),
		"worker pool with load":     regexp.MustCompile(`<tr data-pool="echo"><td>echo</td><td>2</td>`),
		"DLQ entry of the lost job": regexp.MustCompile(`<tr data-entry="[0-9]+-[0-9]+">.*?job-ui-lost.*?topic_unmapped`),
		"page finished loading":     regexp.MustCompile(`<body data-loaded="true">`),
	} {
		if !re.Match(dom) {
			t.Errorf("dashboard lacks %s (%s)", what, re)
		}
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
		return
	}

	if err := os.MkdirAll(artifactsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot, err := filepath.Abs(filepath.Join(artifactsDir, "dashboard.png"))
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(shot)
	// The screenshot is an artifact for people, not an assertion (the DOM
	// above is): chromium's screenshot mode has hung past chromiumTimeout on
	// a machine at load 40-50 (pre-check of 334cf3d), so a run that does not
	// finish is logged, not failed. One that finishes must leave a PNG.
	if _, err := runHeadless(t, bin, url, "--screenshot="+shot, "--window-size=1400,1900", "--force-device-scale-factor=1"); err != nil {
		t.Logf("no dashboard screenshot: %v", err)
		return
	}
	png, err := os.ReadFile(shot)
	if err != nil || len(png) < 1000 || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("screenshot %s: %d bytes, err %v", shot, len(png), err)
	}
	t.Logf("dashboard screenshot: %s (%d bytes)", shot, len(png))
}
