package faults_test

// The rig of the process fault tests (issue 20 item 8, issue 15): a private
// redis-server and nats-server, `troupe node` processes with their admin
// servers (for /metrics) and worker processes — `troupe worker`, or the
// stock CAP worker of testdata/stockworker — all on loopback, in the shapes
// each test needs. Like the fault suite, they run with TROUPE_FAULTS=1
// (`make test-faults`).

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// procRig is one test's cluster of processes.
type procRig struct {
	t                   *testing.T
	dir                 string
	bin                 string
	redisPort, natsPort int
	redis, nats         *proc
	nodes               []*proc
	adminPorts          []int
	workers             map[string]*proc
	rdb                 *redis.Client
	st                  *store.Store
	nc                  *nats.Conn
	js                  jetstream.JetStream
	subj                bus.Subjects

	failMu   sync.Mutex
	failures []string // the errors reported through Errorf, restated after the logs
}

// reporter is what the rig's checks report failures to: the test itself,
// or the rig (Errorf below), which also restates them after the process
// logs it prints on a failure, so that they are the last thing a CI
// excerpt of the output shows.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// Errorf reports a failure of the test and keeps it to restate after the
// process logs (stopAll).
func (r *procRig) Errorf(format string, args ...any) {
	r.t.Helper()
	msg := fmt.Sprintf(format, args...)
	r.t.Error(msg)
	r.failMu.Lock()
	r.failures = append(r.failures, msg)
	r.failMu.Unlock()
}

// Fatalf reports a failure as Errorf does and stops the test (call it from
// the test's goroutine, as t.Fatalf).
func (r *procRig) Fatalf(format string, args ...any) {
	r.t.Helper()
	r.Errorf(format, args...)
	r.t.FailNow()
}

// Helper marks the rig's caller as a test helper (the reporter interface).
func (r *procRig) Helper() { r.t.Helper() }

type procRigOptions struct {
	nodes int           // default 2
	lock  time.Duration // --lock-ttl (default 2 s)
	// dispatch and running are the timeouts.yaml deadlines.
	dispatch, running time.Duration
	logLevel          string // the nodes' (default info: eviction and pause lines)
}

// procFaultsGate skips a test unless the fault tests were asked for.
func procFaultsGate(t *testing.T) {
	t.Helper()
	if os.Getenv("TROUPE_FAULTS") == "" {
		t.Skip("the process fault tests run with TROUPE_FAULTS=1 (make test-faults)")
	}
	if testing.Short() {
		t.Skip("runs node and worker processes")
	}
}

func newProcRig(t *testing.T, o procRigOptions) *procRig {
	t.Helper()
	if o.nodes == 0 {
		o.nodes = 2
	}
	if o.lock == 0 {
		o.lock = 2 * time.Second
	}
	if o.logLevel == "" {
		o.logLevel = "info"
	}
	for _, b := range []string{"redis-server", "nats-server"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed", b)
		}
	}
	r := &procRig{t: t, dir: t.TempDir(), bin: troupeBinary(t), redisPort: freePort(t), natsPort: freePort(t),
		workers: map[string]*proc{}}
	t.Cleanup(r.stopAll)
	r.redis = &proc{name: "redis", bin: "redis-server", log: filepath.Join(r.dir, "redis.log"),
		args: []string{"--port", strconv.Itoa(r.redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", r.dir}}
	r.redis.start(t)
	r.nats = &proc{name: "nats", bin: "nats-server", log: filepath.Join(r.dir, "nats.log"),
		args: []string{"-a", "127.0.0.1", "-p", strconv.Itoa(r.natsPort), "-js", "-sd", filepath.Join(r.dir, "js")}}
	r.nats.start(t)
	waitPort(t, r.redisPort)
	waitPort(t, r.natsPort)

	timeouts := filepath.Join(r.dir, "timeouts.yaml")
	if err := os.WriteFile(timeouts, []byte(fmt.Sprintf("reconciler: {dispatch_timeout_seconds: %d, running_timeout_seconds: %d}\n",
		int(o.dispatch/time.Second), int(o.running/time.Second))), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= o.nodes; i++ {
		id := fmt.Sprintf("n%d", i)
		port := freePort(t)
		r.adminPorts = append(r.adminPorts, port)
		n := &proc{name: id, bin: r.bin, log: filepath.Join(r.dir, id+".log"),
			args: []string{"node", "--id", id, "--nats", r.natsURL(), "--redis", r.redisURL(), "--lock-ttl", o.lock.String(),
				"--timeouts", timeouts, "--admin-listen", "127.0.0.1:" + strconv.Itoa(port), "--log-level", o.logLevel}}
		n.start(t)
		r.nodes = append(r.nodes, n)
	}
	opt, _ := redis.ParseURL(r.redisURL())
	opt.MaxRetries = -1
	r.rdb = redis.NewClient(opt)
	r.st = store.New(r.rdb, store.Config{})
	nc, err := nats.Connect(r.natsURL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r.nc = nc
	r.js, _ = jetstream.New(nc)
	r.subj = bus.NewSubjects("")
	ctx := context.Background()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := r.js.Stream(ctx, bus.StreamName("TROUPE", bus.StreamSubmit)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the nodes never created their streams")
		}
	}
	return r
}

func (r *procRig) natsURL() string  { return "nats://127.0.0.1:" + strconv.Itoa(r.natsPort) }
func (r *procRig) redisURL() string { return "redis://127.0.0.1:" + strconv.Itoa(r.redisPort) }

// troupeWorker starts `troupe worker --id id` with its receipts file and
// the extra flags given.
func (r *procRig) troupeWorker(id string, extra ...string) *proc {
	args := append([]string{"worker", "--id", id, "--nats", r.natsURL(), "--topics", "job.echo",
		"--receipts", r.receiptsPath(id), "--log-level", "warn"}, extra...)
	w := &proc{name: id, bin: r.bin, args: args, log: filepath.Join(r.dir, id+".log")}
	w.start(r.t)
	r.workers[id] = w
	return w
}

// stockWorker starts the stock CAP worker of testdata/stockworker.
func (r *procRig) stockWorker(id string, extra ...string) *proc {
	args := append([]string{"--id", id, "--nats", r.natsURL(), "--topics", "job.echo",
		"--receipts", r.receiptsPath(id)}, extra...)
	w := &proc{name: id, bin: stockWorkerBinary(r.t), args: args, log: filepath.Join(r.dir, id+".log")}
	w.start(r.t)
	r.workers[id] = w
	return w
}

var (
	stockOnce sync.Once
	stockPath string
	stockErr  error
)

// stockWorkerBinary builds testdata/stockworker once per test binary.
func stockWorkerBinary(t *testing.T) string {
	t.Helper()
	stockOnce.Do(func() {
		dir, err := os.MkdirTemp("", "troupe-stockworker-")
		if err != nil {
			stockErr = err
			return
		}
		stockPath = filepath.Join(dir, "stockworker")
		out, err := exec.Command("go", "build", "-o", stockPath, "./testdata/stockworker").CombinedOutput()
		if err != nil {
			stockErr = fmt.Errorf("go build stockworker: %v: %s", err, out)
		}
	})
	if stockErr != nil {
		t.Fatal(stockErr)
	}
	return stockPath
}

func (r *procRig) receiptsPath(worker string) string { return filepath.Join(r.dir, worker+".receipts") }

func (r *procRig) stopAll() {
	for _, w := range r.workers {
		w.kill()
	}
	for _, n := range r.nodes {
		n.kill()
	}
	for _, p := range []*proc{r.nats, r.redis} {
		if p != nil {
			p.kill()
		}
	}
	if r.nc != nil {
		r.nc.Close()
	}
	if r.rdb != nil {
		_ = r.rdb.Close()
	}
	if r.t.Failed() {
		var ps []*proc
		ps = append(ps, r.nodes...)
		for _, w := range r.workers {
			ps = append(ps, w)
		}
		for _, p := range ps {
			if b, err := os.ReadFile(p.log); err == nil {
				if len(b) > 6000 {
					b = b[len(b)-6000:]
				}
				r.t.Logf("%s log (tail):\n%s", p.name, b)
			}
		}
		r.failMu.Lock()
		if len(r.failures) > 0 {
			r.t.Logf("the test's errors again, after the logs (%d):\n%s", len(r.failures), strings.Join(r.failures, "\n"))
		}
		r.failMu.Unlock()
	}
}

// metric sums every series of the metric name (labelled or not) on node i
// (-1: every node that answers).
func (r *procRig) metric(i int, name string) float64 {
	total := 0.0
	client := &http.Client{Timeout: 2 * time.Second}
	for j, port := range r.adminPorts {
		if i >= 0 && j != i {
			continue
		}
		resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, name) {
				continue
			}
			rest := line[len(name):]
			if !strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{") {
				continue
			}
			fields := strings.Fields(rest)
			if f, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
				total += f
			}
		}
		resp.Body.Close()
	}
	return total
}

// waitWorkers waits until every node counts n live workers.
func (r *procRig) waitWorkers(n int) {
	r.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		all := true
		for i := range r.nodes {
			if r.metric(i, "troupe_live_workers") < float64(n) {
				all = false
			}
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the nodes never all saw %d live workers", n)
		}
	}
}

// logCount counts the lines of p's log that contain s.
func logCount(p *proc, s string) int {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), s)
}

// submit publishes one job on the submit stream, retrying as a client
// would (a duplicate submit changes nothing).
func (r *procRig) submit(id string) {
	if err := submitRetrying(r.js, r.subj.Submit, "proc-faults", id, 100); err != nil {
		r.t.Error(err)
	}
}

// submitAt submits n jobs named prefix-<i> at rate per second from a
// goroutine; onSubmit (if set) sees each index after its submit. The ids
// come back when all are submitted.
func (r *procRig) submitAt(prefix string, n, rate int, onSubmit func(i int)) <-chan []string {
	out := make(chan []string, 1)
	go func() {
		start := time.Now()
		every := time.Second / time.Duration(rate)
		ids := make([]string, 0, n)
		for i := 0; i < n; i++ {
			if d := time.Until(start.Add(time.Duration(i) * every)); d > 0 {
				time.Sleep(d)
			}
			id := prefix + "-" + strconv.Itoa(i)
			r.submit(id)
			ids = append(ids, id)
			if onSubmit != nil {
				onSubmit(i)
			}
		}
		out <- ids
	}()
	return out
}

// states reads the state of every job (one pipeline); "" for no record.
func (r *procRig) states(ids []string) map[string]jobstate.State {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pipe := r.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HGet(ctx, r.st.Keys().Job(id), "s")
	}
	_, _ = pipe.Exec(ctx)
	out := make(map[string]jobstate.State, len(ids))
	for i, c := range cmds {
		out[ids[i]] = jobstate.State(c.Val())
	}
	return out
}

// waitTerminalBy polls until done(id, state) holds for every job, or the
// deadline passes; it returns when that was, and the jobs still not done.
func (r *procRig) waitTerminalBy(ids []string, deadline time.Time, done func(id string, s jobstate.State) bool) (time.Time, []string) {
	for {
		var left []string
		for id, s := range r.states(ids) {
			if !done(id, s) {
				left = append(left, id)
			}
		}
		sort.Strings(left)
		if len(left) == 0 || time.Now().After(deadline) {
			return time.Now(), left
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// allTerminalBy waits until every job is terminal or the deadline passes,
// reports each job left over as an error (its state, reason, deadline kind
// and history, time counted from since, "after <what>"), and returns when
// the wait ended and every job's record.
func (r *procRig) allTerminalBy(t reporter, ids []string, deadline, since time.Time, what string) (time.Time, map[string]*store.JobRecord) {
	t.Helper()
	at, left := r.waitTerminalBy(ids, deadline, func(_ string, s jobstate.State) bool { return s.Terminal() })
	recs := r.records(ids)
	for _, id := range left {
		if rec := recs[id]; rec != nil {
			t.Errorf("%s still %s (%s, deadline %s) %v after %s: %s", id, rec.State, rec.Reason,
				rec.Fields["deadline_kind"], time.Since(since).Round(time.Second), what, hops(rec))
		} else {
			t.Errorf("%s has no record", id)
		}
	}
	return at, recs
}

// records reads every job's final record (nil: none).
func (r *procRig) records(ids []string) map[string]*store.JobRecord {
	out := make(map[string]*store.JobRecord, len(ids))
	for _, id := range ids {
		rec, err := r.st.GetJob(context.Background(), id)
		if err != nil {
			rec = nil
		}
		out[id] = rec
	}
	return out
}

// receiptLines reads a worker's receipts: job ids in the order received,
// and the repeated deliveries it deduped.
func (r *procRig) receiptLines(worker string) (ids []string, dups int) {
	f, err := os.Open(r.receiptsPath(worker))
	if err != nil {
		return nil, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
		case strings.HasPrefix(line, "dup "):
			dups++
		default:
			ids = append(ids, line)
		}
	}
	return ids, dups
}

// runs counts, per job, how often each worker received (ran) it.
func (r *procRig) runs(workers ...string) map[string]map[string]int {
	out := map[string]map[string]int{}
	for _, w := range workers {
		ids, _ := r.receiptLines(w)
		for _, id := range ids {
			if out[id] == nil {
				out[id] = map[string]int{}
			}
			out[id][w]++
		}
	}
	return out
}

// cancelWatch records the JobCancels published on sys.job.cancel.
type cancelWatch struct {
	mu  sync.Mutex
	got map[string][]string // job id → reasons
}

func (r *procRig) watchCancels() *cancelWatch {
	r.t.Helper()
	cw := &cancelWatch{got: map[string][]string{}}
	_, err := r.nc.Subscribe(r.subj.Cancel, func(m *nats.Msg) {
		pkt, err := bus.Decode(m.Data)
		if c := pkt.GetJobCancel(); err == nil && c != nil {
			cw.mu.Lock()
			cw.got[c.JobId] = append(cw.got[c.JobId], c.Reason)
			cw.mu.Unlock()
		}
	})
	if err != nil {
		r.t.Fatal(err)
	}
	_ = r.nc.Flush()
	return cw
}

func (cw *cancelWatch) reasons(id string) []string {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return append([]string(nil), cw.got[id]...)
}

// stateCounts is "STATE/reason=n ..." over the records.
func stateCounts(recs map[string]*store.JobRecord) string {
	c := map[string]int{}
	for _, rec := range recs {
		k := "no record"
		if rec != nil {
			k = string(rec.State) + "/" + string(rec.Reason)
		}
		c[k]++
	}
	var parts []string
	for k, n := range c {
		parts = append(parts, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// hops renders a record's history as "FROM>TO(reason)@node ...".
func hops(rec *store.JobRecord) string {
	var parts []string
	for _, h := range rec.History {
		parts = append(parts, fmt.Sprintf("%s>%s(%s)@%s", h.From, h.To, h.Reason, h.Node))
	}
	return strings.Join(parts, " ")
}

// startedThenRedispatched reports whether the job was recorded RUNNING and
// later sent back to SCHEDULED for a lost worker: a started job dispatched
// again.
func startedThenRedispatched(rec *store.JobRecord) bool {
	started := false
	for _, h := range rec.History {
		if h.To == jobstate.StateRunning {
			started = true
		}
		if started && h.To == jobstate.StateScheduled && h.Reason == jobstate.ReasonWorkerLost {
			return true
		}
	}
	return false
}

// redispatched reports whether the job went back to SCHEDULED for a lost
// worker.
func redispatched(rec *store.JobRecord) bool {
	for _, h := range rec.History {
		if h.To == jobstate.StateScheduled && h.Reason == jobstate.ReasonWorkerLost {
			return true
		}
	}
	return false
}
