package main

import (
	"net"
	"strings"
	"testing"

	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/connect"
)

// On its standard ports `troupe dev` is where every command looks by
// default, so what it suggests running needs no address flags; when a
// server had to take another port, one export line points the commands
// there (the commands then still need no flags).
func TestDevSuggestsCommandsThatReachIt(t *testing.T) {
	t.Parallel()
	hint := devTryHint(connect.NATSURLDefault, connect.RedisURLDefault, admin.URLDefault)
	for _, want := range []string{"troupe submit --topic job.echo --wait\n", "troupe job list\n", "troupe workers\n",
		"troupe trace <job_id>\n"} {
		if !strings.Contains(hint, want) {
			t.Errorf("hint lacks %q:\n%s", want, hint)
		}
	}
	if strings.Contains(hint, "--nats") || strings.Contains(hint, "--redis") || strings.Contains(hint, "--api") ||
		strings.Contains(hint, "export") {
		t.Errorf("hint on the standard ports has address flags or exports:\n%s", hint)
	}

	hint = devTryHint("nats://127.0.0.1:40001", "redis://127.0.0.1:40002", "http://127.0.0.1:40003")
	want := "export TROUPE_NATS_URL=nats://127.0.0.1:40001 TROUPE_REDIS_URL=redis://127.0.0.1:40002 TROUPE_API_URL=http://127.0.0.1:40003\n"
	if !strings.Contains(hint, want) || !strings.Contains(hint, "troupe job list\n") || strings.Contains(hint, "--api") {
		t.Errorf("hint lacks %q or has flags:\n%s", want, hint)
	}
	// Only what moved is exported.
	if ex := devExports(connect.NATSURLDefault, connect.RedisURLDefault, "http://127.0.0.1:40003"); ex != "export TROUPE_API_URL=http://127.0.0.1:40003" {
		t.Errorf("exports = %q", ex)
	}
	// Without an admin API there is nothing for the operator commands to reach.
	if hint = devTryHint(connect.NATSURLDefault, connect.RedisURLDefault, ""); strings.Contains(hint, "job list") {
		t.Errorf("hint without an API suggests operator commands:\n%s", hint)
	}
}

// The standard addresses are the commands' defaults, and a taken one
// gives way to a free port on the same host.
func TestDevListensOnTheStandardAddressWhenFree(t *testing.T) {
	t.Parallel()
	if devNATSAddr != "127.0.0.1:4222" || devRedisAddr != "127.0.0.1:6379" || admin.ListenDefault != "127.0.0.1:8080" {
		t.Fatalf("standard addresses %s %s %s", devNATSAddr, devRedisAddr, admin.ListenDefault)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().String()
	if got, err := devListen(taken); err != nil || got == taken || !strings.HasPrefix(got, "127.0.0.1:") {
		t.Fatalf("devListen(%s taken) = %s, %v", taken, got, err)
	}
	_ = ln.Close()
	if got, err := devListen(taken); err != nil || got != taken {
		t.Fatalf("devListen(%s free) = %s, %v", taken, got, err)
	}
}
