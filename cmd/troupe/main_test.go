package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

// Asking any command for help prints its usage and exits 0; a wrong flag
// or command is still a usage error (2).
func TestHelpExitsZero(t *testing.T) {
	t.Parallel()
	lines := [][]string{{"help"}, {"--help"}, {"-h"},
		{"ctl", "job", "list", "--help"}, {"ctl", "job", "submit", "-h"}, {"ctl", "dlq", "list", "-h"},
		{"ctl", "workers", "--help"}, {"ctl", "pools", "-h"}, {"ctl", "trace", "-h"},
		{"job", "approve", "--help"}, {"job", "cancel", "-h"}, {"job", "list", "--help"},
		{"safety", "serve", "--help"}, {"safety", "check", "-h"}, {"safety", "validate", "--help"},
		{"keys", "gen", "--help"}}
	for _, c := range commands {
		lines = append(lines, []string{c.name, "--help"}, []string{c.name, "-h"})
	}
	for _, line := range lines {
		var errOut bytes.Buffer
		if code := run(context.Background(), line, &errOut); code != 0 {
			t.Errorf("troupe %s: exit %d, want 0\n%s", strings.Join(line, " "), code, errOut.String())
		}
	}
	for _, line := range [][]string{nil, {"no-such-command"}, {"workers", "--no-such-flag"}, {"submit", "--wait=maybe"}} {
		var errOut bytes.Buffer
		if code := run(context.Background(), line, &errOut); code != 2 {
			t.Errorf("troupe %s: exit %d, want 2\n%s", strings.Join(line, " "), code, errOut.String())
		}
	}
}

// --pprof-listen serves Go's profiles, on loopback only.
func TestPprofListenServesProfilesOnLoopbackOnly(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, addr := range []string{"0.0.0.0:0", "10.1.2.3:0", ":0"} {
		if _, _, err := startPprof(addr, log); err == nil {
			t.Errorf("--pprof-listen %s accepted; want loopback only", addr)
		}
	}
	addr, stop, err := startPprof("127.0.0.1:0", log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "goroutine profile") {
		t.Fatalf("goroutine profile: %d %.100q", resp.StatusCode, body)
	}
}
