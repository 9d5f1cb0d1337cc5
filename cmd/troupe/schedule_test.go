package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/schedule"
)

func TestScheduleCLIDrivesTheScheduleAPI(t *testing.T) {
	t.Parallel()
	api := ctlNode(t)

	out, errOut, err := ctl(t, api, "schedule", "create", "tick-echo", "--every", "1s", "--topic", "job.echo",
		"--tenant", "acme", "--missed", "catch_up", "--catch-up", "5")
	if err != nil || !strings.Contains(out, "every 1s") || !strings.Contains(out, "catch_up 5") {
		t.Fatalf("create: %v\n%s%s", err, out, errOut)
	}
	if _, _, err := ctl(t, api, "schedule", "create", "bad", "--cron", "61 * * * *", "--topic", "job.echo"); err == nil ||
		!strings.Contains(err.Error(), "minute: 61 out of range") {
		t.Fatalf("bad cron: %v", err)
	}
	out, _, err = ctl(t, api, "schedule", "list")
	if err != nil || !regexp.MustCompile(`(?m)^tick-echo\s+every 1s\s+job\.echo\s+acme\s+catch_up 5\s+active`).MatchString(out) {
		t.Fatalf("list: %v\n%s", err, out)
	}
	// A tick's job runs to SUCCEEDED.
	var s schedule.Schedule
	for deadline := time.Now().Add(15 * time.Second); s.Last == nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the schedule never fired")
		}
		out, _, err = ctl(t, api, "schedule", "get", "tick-echo", "--json")
		if err != nil || json.Unmarshal([]byte(out), &s) != nil {
			t.Fatalf("get: %v\n%s", err, out)
		}
	}
	if _, _, err := ctl(t, api, "job", "wait", s.Last.JobID, "--timeout", "20s"); err != nil {
		t.Fatalf("tick job %s: %v", s.Last.JobID, err)
	}
	out, _, err = ctl(t, api, "schedule", "pause", "tick-echo")
	if err != nil || !strings.Contains(out, "paused") || !regexp.MustCompile(`next tick\s+-`).MatchString(out) {
		t.Fatalf("pause: %v\n%s", err, out)
	}
	out, _, err = ctl(t, api, "schedule", "resume", "tick-echo")
	if err != nil || !strings.Contains(out, "active") {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	if out, _, err = ctl(t, api, "schedule", "delete", "tick-echo"); err != nil || !strings.Contains(out, "deleted") {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	if _, _, err := ctl(t, api, "schedule", "get", "tick-echo"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("get after delete: %v", err)
	}

	// A delayed job is listed until its time; deleted, it never runs.
	if out, errOut, err = ctl(t, api, "job", "submit", "--id", "job-later", "--label", "troupe.run_after=1h"); err != nil {
		t.Fatalf("submit delayed: %v\n%s%s", err, out, errOut)
	}
	var l admin.DelayedList
	for deadline := time.Now().Add(10 * time.Second); len(l.Delayed) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the delayed job was never listed")
		}
		out, _, err = ctl(t, api, "schedule", "delayed", "--json")
		if err != nil || json.Unmarshal([]byte(out), &l) != nil {
			t.Fatalf("delayed: %v\n%s", err, out)
		}
	}
	if d := l.Delayed[0]; d.JobID != "job-later" || d.Due.Sub(d.Submitted) < time.Hour || d.Due.Sub(d.Submitted) > time.Hour+time.Millisecond {
		t.Fatalf("delayed: %+v, want job-later due an hour after its submit", d)
	}
	out, _, err = ctl(t, api, "schedule", "delayed")
	if err != nil || !regexp.MustCompile(`(?m)^job-later\s+\S+ \S+\s+job\.echo`).MatchString(out) {
		t.Fatalf("delayed table: %v\n%s", err, out)
	}
	if out, _, err = ctl(t, api, "schedule", "delayed", "delete", "job-later"); err != nil || !strings.Contains(out, "deleted") {
		t.Fatalf("delayed delete: %v\n%s", err, out)
	}
	if out, _, _ = ctl(t, api, "schedule", "delayed"); !strings.Contains(out, "no delayed jobs") {
		t.Fatalf("after delete:\n%s", out)
	}
}
