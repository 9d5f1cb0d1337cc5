package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/worker"
)

// The tests in this file run the built troupe binary, as a user does,
// against a node embedded in the test (real Redis and NATS via testenv)
// or against `troupe dev`.

// binCommandTimeout bounds one run of the binary.
const binCommandTimeout = 60 * time.Second

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// troupeBinary builds the binary once per test run.
func troupeBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the troupe binary")
	}
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "troupe-cli-test-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "troupe")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// cliEnv is the environment the binary runs in: the host's, without any
// TROUPE_ setting that could point it elsewhere, plus extra.
func cliEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TROUPE_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// binResult is one run of the binary.
type binResult struct {
	out, errOut string
	code        int
}

func (r binResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.errOut)
}

// runBin runs the binary with args in env and returns what it printed and
// its exit status.
func runBin(t *testing.T, env []string, args ...string) binResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), binCommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, troupeBinary(t), args...)
	cmd.Env = env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := binResult{out: out.String(), errOut: errOut.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("troupe %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// cliNode starts a node whose policy holds job.approve for a human, with
// one echo worker and its admin API, and returns the environment that
// points the binary at it, and the node.
func cliNode(t *testing.T) ([]string, *troupe.Node) {
	t.Helper()
	env := testenv.New(t)
	pools := &troupe.Pools{Topics: map[string][]string{"job.echo": {"echo"}, "job.approve": {"echo"}}}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := troupe.NewNode(troupe.Config{NodeID: "node-cli", NATSURL: env.NATSURL, RedisURL: env.RedisURL,
		KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(), Pools: pools,
		Policy: safety.TopicRules{Approve: []string{"job.approve"}}, Tuning: troupe.Tuning{PermanentGrace: 100 * time.Millisecond}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	w, err := worker.Start(env.NATS, worker.Config{ID: "w1", Pool: "echo", Topics: []string{"job.echo"}, Direct: true,
		SubjectPrefix: inspect.Of(node).Subjects().Prefix(), Handler: worker.Echo, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	if err := node.WaitForWorkers(ctx, "echo", 1); err != nil {
		t.Fatal(err)
	}
	srv, err := admin.NewServer(admin.Config{Node: inspect.Of(node), Registry: node.Metrics(), Listen: "127.0.0.1:0",
		APIKeys: map[string]string{ctlTestKey: admin.AllTenants, ctlSubmitterKey: admin.AllTenants}, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	return cliEnv("TROUPE_API_URL=http://"+srv.Addr(), "TROUPE_API_KEY="+ctlTestKey), node
}

// waitJobState runs `troupe job <id> --json` until the job is in state.
func waitJobState(t *testing.T, env []string, id, state string) admin.Job {
	t.Helper()
	var last binResult
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		last = runBin(t, env, "job", id, "--json")
		var j admin.Job
		if last.code == 0 && json.Unmarshal([]byte(last.out), &j) == nil && j.State == state {
			return j
		}
	}
	t.Fatalf("job %s never %s; last `troupe job %s --json`: %s", id, state, id, last)
	return admin.Job{}
}

// README's approval commands, flags after the id, work as printed. The jobs
// are submitted with another key: nobody approves a job they submitted.
func TestCLIApproveAndCancelTakeFlagsAfterTheID(t *testing.T) {
	t.Parallel()
	env, _ := cliNode(t)
	submitter := append(append([]string(nil), env...), "TROUPE_API_KEY="+ctlSubmitterKey)
	for _, id := range []string{"dz-1", "dz-2"} {
		if r := runBin(t, submitter, "submit", "--topic", "job.approve", "--id", id); r.code != 0 {
			t.Fatalf("submit %s: %s", id, r)
		}
		waitJobState(t, env, id, "APPROVAL_REQUIRED")
	}
	// The decider is the key's principal: --by naming someone else is refused.
	if r := runBin(t, env, "job", "approve", "dz-1", "--reason", "looks fine", "--by", "alice"); r.code == 0 {
		t.Fatalf("troupe job approve dz-1 --by alice (not the key's principal) succeeded: %s", r)
	}
	// The submitter's own key may not approve it.
	if r := runBin(t, submitter, "job", "approve", "dz-1", "--reason", "mine"); r.code == 0 {
		t.Fatalf("the submitter approved its own job: %s", r)
	}
	// As README prints it.
	if r := runBin(t, env, "job", "approve", "dz-1", "--reason", "looks fine"); r.code != 0 {
		t.Fatalf("troupe job approve dz-1 --reason …: %s", r)
	}
	waitJobState(t, env, "dz-1", "SUCCEEDED")
	if r := runBin(t, env, "job", "cancel", "dz-2", "--reason", "not wanted"); r.code != 0 {
		t.Fatalf("troupe job cancel dz-2 --reason …: %s", r)
	}
	waitJobState(t, env, "dz-2", "CANCELLED")
}

// Every read takes --json and prints JSON that parses into the API's type.
func TestCLIReadsPrintJSON(t *testing.T) {
	t.Parallel()
	env, node := cliNode(t)
	if r := runBin(t, env, "submit", "--topic", "job.echo", "--id", "js-1", "--wait"); r.code != 0 {
		t.Fatalf("submit --wait: %s", r)
	}
	// A workflow step with a compensation, for `troupe saga`.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := node.Submit(ctx, &capv1.JobRequest{JobId: "wf-1-s0", Topic: "job.echo", WorkflowId: "wf-1",
		Compensation: &capv1.Compensation{Topic: "job.echo"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Wait(ctx, "wf-1-s0"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		into any
	}{
		{[]string{"job", "js-1", "--json"}, &jobWithData{}},
		{[]string{"job", "--json", "js-1"}, &jobWithData{}},
		{[]string{"job", "status", "js-1", "--json"}, &jobWithData{}},
		{[]string{"job", "list", "--json"}, &admin.JobList{}},
		{[]string{"dlq", "--json"}, &admin.DLQList{}},
		{[]string{"dlq", "list", "--json"}, &admin.DLQList{}},
		{[]string{"pool", "--json"}, &admin.PoolList{}},
		{[]string{"pool", "get", "job.echo", "--json"}, &admin.TopicMapping{}},
		{[]string{"workers", "--json"}, &admin.WorkerList{}},
		{[]string{"trace", "js-1", "--json"}, &admin.Trace{}},
		{[]string{"ctl", "stats", "--json"}, &admin.Stats{}},
		{[]string{"version", "--json"}, &buildVersion{}},
		{[]string{"saga", "wf-1", "--json"}, &saga.Report{}},
	} {
		r := runBin(t, env, c.args...)
		if r.code != 0 {
			t.Errorf("troupe %s: %s", strings.Join(c.args, " "), r)
			continue
		}
		dec := json.NewDecoder(strings.NewReader(r.out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(c.into); err != nil {
			t.Errorf("troupe %s: output does not parse as %T: %v\n%s", strings.Join(c.args, " "), c.into, err, r.out)
		}
	}
	if r := runBin(t, env, "saga", "wf-1"); r.code != 0 || !strings.Contains(r.out, "stack (1 steps") || !strings.Contains(r.out, "wf-1-s0") {
		t.Errorf("troupe saga wf-1: %s", r)
	}
	if r := runBin(t, env, "saga", "wf-none"); r.code != 1 || !strings.Contains(r.errOut, "no saga for workflow wf-none") {
		t.Errorf("troupe saga of an unknown workflow: %s", r)
	}
	var j admin.Job
	r := runBin(t, env, "job", "js-1", "--json")
	if err := json.Unmarshal([]byte(r.out), &j); err != nil || j.ID != "js-1" || j.State != "SUCCEEDED" {
		t.Fatalf("job --json: %v %+v", err, j)
	}
}

// A waited job that does not end SUCCEEDED makes the command fail.
func TestCLISubmitWaitExitsNonZeroUnlessSucceeded(t *testing.T) {
	t.Parallel()
	env, _ := cliNode(t)
	r := runBin(t, env, "submit", "--topic", "job.nope", "--id", "nope-1", "--wait", "--timeout", "30s")
	if r.code != 1 || !strings.Contains(r.out, "state FAILED") || !strings.Contains(r.errOut, "ended FAILED") {
		t.Fatalf("submit --wait of a job no topic routes: %s\nwant exit 1, the FAILED job and why", r)
	}
	if r := runBin(t, env, "submit", "--topic", "job.echo", "--wait"); r.code != 0 || !strings.Contains(r.out, "state SUCCEEDED") {
		t.Fatalf("submit --wait of a job that succeeds: %s", r)
	}
	// job wait of a job submitted before: the same answer.
	if r := runBin(t, env, "job", "wait", "nope-1", "--json"); r.code != 1 || !strings.Contains(r.out, `"state": "FAILED"`) {
		t.Fatalf("job wait of a FAILED job: %s", r)
	}
}

// -h names each command's subcommands and arguments; version names the build.
func TestCLIHelpListsSubcommandsAndArguments(t *testing.T) {
	t.Parallel()
	env := cliEnv()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"-h"}, []string{"version", "job", "dlq", "pool", "saga", "TROUPE_API_URL"}},
		{[]string{"pool", "-h"}, []string{"pool get <topic>", "pool map <topic> <pool>", "pool unmap <topic>", "pool [list]"}},
		{[]string{"dlq", "-h"}, []string{"dlq retry <entry_id>", "dlq delete <entry_id>", "dlq [list]"}},
		{[]string{"trace", "-h"}, []string{"trace <job_id>", "-json"}},
		{[]string{"saga", "-h"}, []string{"saga <workflow_id>"}},
		{[]string{"job", "-h"}, []string{"job <job_id>", "job approve <job_id>", "job cancel <job_id>", "job submit", "job list"}},
		{[]string{"job", "approve", "-h"}, []string{"job approve <job_id>", "-reason"}},
		{[]string{"submit", "-h"}, []string{"-wait", "-timeout", "5m0s", "-bus"}},
		{[]string{"worker", "-h"}, []string{"-pool", "-topics", "Not a filter"}},
		{[]string{"node", "-h"}, []string{"-retention", "-dlq-retention"}},
		{[]string{"ctl", "-h"}, []string{"saga <workflow_id>", "pool list|get|map|unmap"}},
	} {
		r := runBin(t, env, c.args...)
		if r.code != 0 {
			t.Errorf("troupe %s: %s", strings.Join(c.args, " "), r)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(r.errOut, w) {
				t.Errorf("troupe %s does not mention %q:\n%s", strings.Join(c.args, " "), w, r.errOut)
			}
		}
	}
	r := runBin(t, env, "version")
	if want := readVersion(); r.code != 0 || !strings.HasPrefix(r.out, "troupe ") || !strings.Contains(r.out, want.Go) {
		t.Fatalf("troupe version: %s", r)
	}
}

// `troupe dev` on a machine whose standard ports are taken (this one runs
// Redis on 6379) prints an export line; with it, every operator command
// reaches the dev node with no flags.
func TestCLIDevExportLineReachesTheDevNode(t *testing.T) {
	t.Parallel()
	bin := troupeBinary(t)
	// A Redis on the standard port (as on a developer's machine) makes dev
	// move its own, and say so.
	redisTaken := false
	if c, err := net.DialTimeout("tcp", devRedisAddr, time.Second); err == nil {
		redisTaken = true
		_ = c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "dev", "--jobs", "2")
	cmd.Env = cliEnv()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 10 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
	}()
	// Read until the demo is done, keeping the export line.
	var exports, seen []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		seen = append(seen, line)
		if strings.HasPrefix(line, "export ") {
			exports = strings.Fields(strings.TrimPrefix(line, "export "))
		}
		if strings.Contains(line, "demo jobs SUCCEEDED") {
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }() // dev prints the hint after; let it
	if !strings.Contains(strings.Join(seen, "\n"), "2 of 2 demo jobs SUCCEEDED") {
		t.Fatalf("troupe dev never finished its demo:\n%s\nstderr:\n%s", strings.Join(seen, "\n"), errOut.String())
	}
	// Where dev's API is: on its standard address the commands' default
	// reaches it; elsewhere the export line must name it.
	apiURL := ""
	for _, line := range seen {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "api" {
			apiURL = f[1]
		}
	}
	if apiURL == "" {
		t.Fatalf("dev printed no API address:\n%s", strings.Join(seen, "\n"))
	}
	if apiURL != admin.URLDefault && !slices.Contains(exports, "TROUPE_API_URL="+apiURL) {
		t.Fatalf("dev's API at %s, export line %v does not name it:\n%s", apiURL, exports, strings.Join(seen, "\n"))
	}
	if redisTaken && !slices.ContainsFunc(exports, func(kv string) bool { return strings.HasPrefix(kv, "TROUPE_REDIS_URL=") }) {
		t.Fatalf("%s is taken, yet the export line %v names no TROUPE_REDIS_URL:\n%s", devRedisAddr, exports, strings.Join(seen, "\n"))
	}
	t.Logf("dev's API at %s, exports %v", apiURL, exports)
	env := cliEnv(exports...)
	r := runBin(t, env, "job", "list", "--json")
	var list admin.JobList
	if r.code != 0 || json.Unmarshal([]byte(r.out), &list) != nil || len(list.Jobs) < 2 {
		t.Fatalf("troupe job list after the export line: %s", r)
	}
	for _, args := range [][]string{{"job", list.Jobs[0].ID}, {"dlq"}, {"pool"}, {"workers"}, {"trace", list.Jobs[0].ID},
		{"submit", "--topic", "job.echo", "--wait"}} {
		if r := runBin(t, env, args...); r.code != 0 {
			t.Errorf("troupe %s after the export line: %s", strings.Join(args, " "), r)
		}
	}
}
