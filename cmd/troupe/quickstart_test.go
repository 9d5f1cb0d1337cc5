package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// quickStart is README's quick start as a user types it, against `troupe
// dev` with no flags: submit and wait, list, trace, inspect, cancel. It runs
// in a network namespace of its own, where the standard ports are free
// (on a machine running Redis and NATS they are taken, and `dev` would move).
const quickStart = `
set -eu
ip link set lo up
"$T" dev > dev.log 2>&1 &
trap 'kill $! 2>/dev/null || true' EXIT
i=0
until "$T" workers > /dev/null 2>&1; do
  i=$((i+1)); [ "$i" -lt 300 ] || { echo "dev never answered"; cat dev.log; exit 1; }
  sleep 0.1
done
"$T" submit --topic job.echo --id qs-1 --wait
"$T" ctl job list | grep -q qs-1
"$T" trace qs-1 | grep -q Submit
"$T" job qs-1 | grep -q SUCCEEDED
# A job no topic routes to waits (topic_unmapped, within its grace): cancel it.
"$T" submit --topic job.nowhere --id qs-2
"$T" job cancel qs-2
i=0
until "$T" job qs-2 | grep -q CANCELLED; do
  i=$((i+1)); [ "$i" -lt 100 ] || { "$T" job qs-2; exit 1; }
  sleep 0.1
done
echo quick start ok
`

func TestQuickStartFromTheREADME(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs troupe dev")
	}
	if err := exec.Command("unshare", "-n", "true").Run(); err != nil {
		t.Skipf("no network namespace here (unshare -n: %v): the standard ports may be taken", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command to bring the namespace's loopback up")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "troupe")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "-n", "sh", "-c", quickStart)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "T="+bin, "TROUPE_NATS_URL=", "TROUPE_REDIS_URL=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "dev.log"))
		t.Fatalf("quick start: %v\n%s\ndev log:\n%s", err, out, log)
	}
}
