package main

import (
	"bytes"
	"context"
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
