package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/admin"
)

// decodeOut parses a run's stdout as JSON into v, refusing unknown fields.
func decodeOut(t *testing.T, r binResult, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(r.out))
	dec.DisallowUnknownFields()
	if r.code != 0 || dec.Decode(v) != nil {
		t.Fatalf("want JSON of %T: %s", v, r)
	}
}

// The search, retry, bulk and pause commands work through the admin API,
// flags before or after their arguments, with --json.
func TestCLISearchRetryBulkAndPause(t *testing.T) {
	t.Parallel()
	env, _ := cliNode(t)
	if r := runBin(t, env, "submit", "--topic", "job.echo", "--id", "cs-red", "--label", "cordum.team=red", "--wait"); r.code != 0 {
		t.Fatalf("submit: %s", r)
	}
	if r := runBin(t, env, "submit", "--topic", "job.nope", "--id", "cs-fail", "--wait"); r.code != 1 {
		t.Fatalf("submit of an unmapped topic --wait: %s (want exit 1, FAILED)", r)
	}
	var l admin.JobList
	decodeOut(t, runBin(t, env, "ctl", "jobs", "--label", "cordum.team=red", "--since", "1h", "--json"), &l)
	if len(l.Jobs) != 1 || l.Jobs[0].ID != "cs-red" || l.Jobs[0].Labels["cordum.team"] != "red" {
		t.Fatalf("ctl jobs --label: %+v", l.Jobs)
	}
	if r := runBin(t, env, "job", "list", "FAILED", "--topic", "job.nope"); r.code != 0 || !strings.Contains(r.out, "cs-fail") ||
		strings.Contains(r.out, "cs-red") {
		t.Fatalf("job list FAILED --topic job.nope: %s", r)
	}
	var rt admin.Retried
	decodeOut(t, runBin(t, env, "job", "retry", "cs-fail", "--json"), &rt)
	if rt.RetryOf != "cs-fail" || rt.JobID != "cs-fail-retry1" {
		t.Fatalf("job retry: %+v", rt)
	}
	if r := runBin(t, env, "job", "retry", "cs-red"); r.code != 1 || !strings.Contains(r.errOut, "SUCCEEDED") {
		t.Fatalf("retry of a SUCCEEDED job: %s", r)
	}

	var p admin.Paused
	decodeOut(t, runBin(t, env, "pool", "pause", "job.echo", "--json"), &p)
	if !p.Paused || p.Topic != "job.echo" {
		t.Fatalf("pool pause: %+v", p)
	}
	if r := runBin(t, env, "pool"); r.code != 0 || !strings.Contains(r.out, "paused") {
		t.Fatalf("pool list shows the pause: %s", r)
	}
	if r := runBin(t, env, "submit", "--topic", "job.echo", "--id", "cs-held"); r.code != 0 {
		t.Fatalf("submit: %s", r)
	}
	deadline := time.Now().Add(20 * time.Second)
	for j := waitJobState(t, env, "cs-held", "SCHEDULED"); j.Reason != "pool_paused"; j = waitJobState(t, env, "cs-held", "SCHEDULED") {
		if time.Now().After(deadline) {
			t.Fatalf("cs-held waits %q, want pool_paused", j.Reason)
		}
	}
	var br admin.BulkResult
	decodeOut(t, runBin(t, env, "job", "cancel", "--filter", "--state", "SCHEDULED", "--q", "cs-held", "--json"), &br)
	if br.Matched != 1 || br.Done != 1 {
		t.Fatalf("job cancel --filter: %+v", br)
	}
	waitJobState(t, env, "cs-held", "CANCELLED")
	if r := runBin(t, env, "pool", "resume", "job.echo"); r.code != 0 || !strings.Contains(r.out, "resumed") {
		t.Fatalf("pool resume: %s", r)
	}
	if r := runBin(t, env, "submit", "--topic", "job.echo", "--id", "cs-after", "--wait"); r.code != 0 {
		t.Fatalf("submit after the resume: %s", r)
	}
	decodeOut(t, runBin(t, env, "ctl", "bulk", "retry", "--state", "CANCELLED", "--q", "cs-held", "--json"), &br)
	if br.Matched != 1 || br.Done != 1 || br.Retried["cs-held"] == "" {
		t.Fatalf("ctl bulk retry: %+v", br)
	}
	waitJobState(t, env, br.Retried["cs-held"], "SUCCEEDED")
	if r := runBin(t, env, "job", "cancel", "cs-red", "--label", "a=b"); r.code == 0 {
		t.Fatalf("filter flags without --filter: %s", r)
	}
	if r := runBin(t, env, "ctl", "bulk", "cancel"); r.code == 0 {
		t.Fatalf("a bulk cancel with no filter: %s", r)
	}
	decodeOut(t, runBin(t, env, "ctl", "sagas", "--json"), &admin.SagaList{})
	decodeOut(t, runBin(t, env, "ctl", "series", "--window", "5m", "--json"), &admin.Series{})
	for _, args := range [][]string{{"job", "-h"}, {"pool", "-h"}, {"ctl", "-h"}} {
		r := runBin(t, env, args...)
		if !strings.Contains(r.out+r.errOut, "retry") && !strings.Contains(r.out+r.errOut, "pause") {
			t.Errorf("troupe %s does not list the new commands: %s", strings.Join(args, " "), r)
		}
	}
}
