package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/testenv"
)

// dataNode starts a node and its API, and a `troupe worker` process (the
// built binary, as a user runs it) in its pool; it returns the env that
// points the binary at the API, and the test's environment.
func dataNode(t *testing.T) ([]string, *testenv.Env) {
	t.Helper()
	env := testenv.New(t)
	pools := &troupe.Pools{Topics: map[string][]string{"job.echo": {"demo"}, "job.undo": {"demo"}}}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := troupe.NewNode(troupe.Config{NodeID: "node-data", NATSURL: env.NATSURL, RedisURL: env.RedisURL,
		KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(), Pools: pools,
		Tuning: troupe.Tuning{PermanentGrace: 100 * time.Millisecond, SagaPoll: 100 * time.Millisecond}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	srv, err := admin.NewServer(admin.Config{Node: inspect.Of(node), Registry: node.Metrics(), Listen: "127.0.0.1:0",
		APIKeys: map[string]string{ctlTestKey: admin.AllTenants}, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })

	wctx, wcancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(wctx, troupeBinary(t), "worker", "--nats", env.NATSURL, "--subject-prefix", env.Prefix,
		"--pool", "demo", "--topics", "job.echo,job.undo", "--id", "w-data", "--heartbeat", "500ms")
	cmd.Env = cliEnv()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 10 * time.Second
	var werr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &werr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wcancel(); _ = cmd.Wait() })
	if err := node.WaitForWorkers(ctx, "demo", 1); err != nil {
		t.Fatalf("troupe worker never joined: %v\n%s", err, werr.String())
	}
	return cliEnv("TROUPE_API_URL=http://"+srv.Addr(), "TROUPE_API_KEY="+ctlTestKey), env
}

// runBinIn runs the binary with stdin.
func runBinIn(t *testing.T, env []string, stdin string, args ...string) binResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), binCommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, troupeBinary(t), args...)
	cmd.Env, cmd.Stdin = env, strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := binResult{out: out.String(), errOut: errOut.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

// dataIDs are job ids unique to the test; their data keys (CAP's
// convention, no prefix) are deleted after it.
func dataIDs(t *testing.T, env *testenv.Env, names ...string) []string {
	ids := make([]string, len(names))
	for i, n := range names {
		id := env.Prefix + "-" + n
		ids[i] = id
		t.Cleanup(func() {
			env.Client.Del(context.Background(), "ctx:"+id, "res:"+id, "ctx:"+id+":comp")
		})
	}
	return ids
}

// A payload given to submit (inline, or on stdin) is the input the worker
// gets, and `troupe job` shows it and the result, in text and in JSON.
func TestCLISubmitPayloadIsShownByJob(t *testing.T) {
	t.Parallel()
	env, te := dataNode(t)
	ids := dataIDs(t, te, "p1", "p2", "p3")
	if r := runBin(t, env, "submit", "--id", ids[0], "--payload-json", `{"x": 1}`, "--wait"); r.code != 0 {
		t.Fatalf("submit --payload-json --wait: %s", r)
	}
	r := runBin(t, env, "job", ids[0])
	if r.code != 0 || !strings.Contains(r.out, "input redis://ctx:"+ids[0]+" (8 bytes, application/json)") ||
		strings.Count(r.out, `{"x":1}`) != 2 { // stored as given (8 bytes), shown compact
		t.Fatalf("troupe job shows no input and result: %s", r)
	}
	r = runBin(t, env, "job", ids[0], "--json")
	var j jobWithData
	dec := json.NewDecoder(strings.NewReader(r.out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil || j.Data == nil || j.Data.Input == nil || !j.Data.Input.Held ||
		j.State != "SUCCEEDED" {
		t.Fatalf("troupe job --json: %v %s", err, r)
	}
	if body, _ := json.Marshal(j.Data.Input.Body); string(body) != `{"x":1}` {
		t.Fatalf("input body %s", body)
	}
	if r := runBinIn(t, env, "plain text\n", "submit", "--id", ids[1], "--payload", "-", "--wait"); r.code != 0 {
		t.Fatalf("submit --payload -: %s", r)
	}
	if r := runBin(t, env, "job", ids[1]); !strings.Contains(r.out, "(11 bytes, text/plain)") || !strings.Contains(r.out, "    plain text") {
		t.Fatalf("stdin payload: %s", r)
	}
	if r := runBin(t, env, "submit", "--payload-json", `{nope`); r.code != 2 || !strings.Contains(r.errOut, "not JSON") {
		t.Fatalf("a --payload-json that is not JSON: %s", r)
	}
	// --bus stores the payload in Redis itself, then publishes as a CAP client.
	if r := runBin(t, env, "submit", "--bus", "--nats", te.NATSURL, "--subject-prefix", te.Prefix, "--redis", te.RedisURL,
		"--id", ids[2], "--payload-json", `[1, 2]`, "--wait"); r.code != 0 || !strings.Contains(r.out, "    [1,2]") {
		t.Fatalf("submit --bus --payload-json: %s", r)
	}
}

// The demo worker fails a job on request, and a workflow
// step that fails fatally rolls back the steps before it: their
// compensations run, with the payload given to --compensation.
func TestCLIDemoFailureAndSagaRollback(t *testing.T) {
	t.Parallel()
	env, te := dataNode(t)
	ids := dataIDs(t, te, "f1", "s0", "s1")
	wf := te.Prefix + "-wf"
	r := runBin(t, env, "submit", "--id", ids[0], "--env", "demo.fail=1", "--env", "demo.error=on purpose", "--wait")
	if r.code != 1 || !strings.Contains(r.errOut, "ended FAILED") {
		t.Fatalf("submit --env demo.fail=1 --wait: %s", r)
	}
	var j jobWithData
	if r := runBin(t, env, "job", ids[0], "--json"); json.Unmarshal([]byte(r.out), &j) != nil ||
		j.ErrorMessage != "on purpose" || j.ErrorCode != "demo_failed" || j.Reason != "worker_failed" {
		t.Fatalf("the failed job: %s", r)
	}
	if r := runBin(t, env, "submit", "--id", ids[1], "--workflow-id", wf, "--step", "0",
		"--compensation", `job.undo:{"undo": "s0"}`, "--wait"); r.code != 0 {
		t.Fatalf("step 0: %s", r)
	}
	if r := runBin(t, env, "submit", "--id", ids[2], "--workflow-id", wf, "--step", "1", "--env", "demo.fatal=1",
		"--wait"); r.code != 1 || !strings.Contains(r.out, "worker_failed_fatal") {
		t.Fatalf("step 1, fatal: %s", r)
	}
	var rep saga.Report
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r = runBin(t, env, "saga", wf, "--json")
		if json.Unmarshal([]byte(r.out), &rep) == nil && len(rep.Steps) == 1 && rep.Steps[0].CompState == "SUCCEEDED" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the saga never rolled back: %s", r)
		}
	}
	comp := rep.Steps[0].CompJobID
	r = runBin(t, env, "job", comp, "--json")
	j = jobWithData{}
	if err := json.Unmarshal([]byte(r.out), &j); err != nil || j.Data == nil || j.Data.Input == nil || !j.Data.Input.Held {
		t.Fatalf("the compensation's input: %v %s", err, r)
	}
	if body, _ := json.Marshal(j.Data.Input.Body); j.Topic != "job.undo" || string(body) != `{"undo":"s0"}` {
		t.Fatalf("compensation topic %s input %s", j.Topic, body)
	}
}

// quickStartData is README's lines on job data, failures and a saga
// rollback, as printed (ids added, to check each job), against `troupe dev`
// in a network namespace of its own (see quickStart).
const quickStartData = `
set -eu
ip link set lo up
"$T" dev > dev.log 2>&1 &
trap 'kill $! 2>/dev/null || true' EXIT
i=0
until "$T" workers > /dev/null 2>&1; do
  i=$((i+1)); [ "$i" -lt 300 ] || { echo "dev never answered"; cat dev.log; exit 1; }
  sleep 0.1
done
"$T" submit --payload-json '{"n": 3}' --wait | grep -q '"n":3'
echo hello | "$T" submit --payload - --id hi-1 && "$T" job hi-1 | grep -q '^    hello$'
if "$T" submit --env demo.fail=1 --env demo.error=boom --id f-1 --wait; then exit 1; fi
"$T" job f-1 | grep -q 'error demo_failed: boom'
if "$T" submit --topic job.unrouted --id u-1 --wait; then exit 1; fi
"$T" dlq | grep -q u-1
"$T" submit --workflow-id wf-1 --step 0 --compensation 'job.echo:{"undo": "step 0"}' --wait
if "$T" submit --workflow-id wf-1 --step 1 --env demo.fatal=1 --wait; then exit 1; fi
i=0
until "$T" saga wf-1 | grep -q 'rollback completed'; do
  i=$((i+1)); [ "$i" -lt 100 ] || { "$T" saga wf-1; exit 1; }
  sleep 0.1
done
"$T" saga wf-1 | grep -q 'succeeded  SUCCEEDED'
echo data quick start ok
`

func TestQuickStartJobDataFromTheREADME(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs troupe dev")
	}
	if err := exec.Command("unshare", "-n", "true").Run(); err != nil {
		t.Skipf("no network namespace here (unshare -n: %v): the standard ports may be taken", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command to bring the namespace's loopback up")
	}
	bin := troupeBinary(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "-n", "sh", "-c", quickStartData)
	cmd.Dir = dir
	cmd.Env = append(cliEnv(), "T="+bin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "dev.log"))
		t.Fatalf("data quick start: %v\n%s\ndev log:\n%s", err, out, log)
	}
}
