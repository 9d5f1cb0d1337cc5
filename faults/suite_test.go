package faults_test

// The fault suite (`make test-faults`): three `troupe node` processes, two
// `troupe worker` processes that log every receipt, a private redis-server,
// nats-server and (for one scenario) a `troupe safety serve` kernel, all on
// loopback. 10,000 jobs arrive at a steady rate while one thing breaks.
// Every scenario asserts: every job reaches a terminal state, none is lost,
// no worker received a job twice, no job was DENIED because something was
// down; and it reports the time to recover and the throughput during the
// fault. RELIABILITY.md holds the figures.

import (
	"bufio"
	"net/http"

	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Suite settings; TROUPE_FAULTS_JOBS and TROUPE_FAULTS_RATE override the
// first two (a quick local run: TROUPE_FAULTS_JOBS=2000).
const (
	suiteJobsDefault = 10_000
	suiteRateDefault = 500 // jobs/s
	suiteNodes       = 3
	suiteLockTTL     = 2 * time.Second
	suiteWorkerSleep = 20 * time.Millisecond
	// suiteRunning bounds a RUNNING job whose worker died (scenario d).
	suiteRunning = 10 * time.Second
	// suiteDispatch bounds a DISPATCHED job whose request never left a
	// killed node (scenario a).
	suiteDispatch = 20 * time.Second
	// suiteSettle bounds how long after the fault ends every job must be
	// terminal.
	suiteSettle = 3 * time.Minute
)

var terminalStates = []jobstate.State{jobstate.StateSucceeded, jobstate.StateFailed, jobstate.StateTimeout, jobstate.StateCancelled,
	jobstate.StateDenied, jobstate.StateOutputQuarantined}

func init() { redis.SetLogger(quietRedis{}) }

// quietRedis drops go-redis's own log lines (dial failures while the suite's
// Redis is deliberately down).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...interface{}) {}

// suiteLogLevel is the nodes' or workers' log level: warn, or the one
// env names (TROUPE_FAULTS_NODE_LOG_LEVEL, TROUPE_FAULTS_WORKER_LOG_LEVEL;
// a worker at debug logs each receipt with its time).
func suiteLogLevel(env string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return "warn"
}

func suiteEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// proc is one child process of the suite.
type proc struct {
	name string
	args []string
	bin  string
	log  string
	cmd  *exec.Cmd
}

func (p *proc) start(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(p.bin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	cmd := p.cmd
	go func() { _ = cmd.Wait(); f.Close() }()
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	for i := 0; i < 500 && p.cmd.Process.Signal(syscall.Signal(0)) == nil; i++ {
		time.Sleep(10 * time.Millisecond)
	}
}

// term sends SIGTERM and waits (bounded) for the process to exit.
func (p *proc) term() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	for i := 0; i < 1000 && p.cmd.Process.Signal(syscall.Signal(0)) == nil; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	p.kill()
}

// rig is the suite's cluster of processes.
type rig struct {
	t                    *testing.T
	dir                  string
	redisPort, natsPort  int
	kernelPort           int
	redis, nats, kernel  *proc
	nodes, workers       []*proc
	adminPorts           []int // the nodes' admin servers (/metrics), by index
	rdb                  *redis.Client
	st                   *store.Store
	nc                   *nats.Conn
	js                   jetstream.JetStream
	subj                 bus.Subjects
	jobs, rate           int
	samplesMu            sync.Mutex
	samples              []sample // terminal counts over time
	sampleStop, sampleWG chan struct{}
}

type sample struct {
	at       time.Time
	terminal int64
}

type rigOptions struct {
	kernel     bool // nodes ask a `troupe safety serve` process
	redisAOF   bool // Redis keeps an append-only file (survives a restart)
	workerHold time.Duration
	// workerReconnect is the workers' NATS reconnect wait (0: nats.go's 2 s);
	// workerReconnects, when set, each worker's (w1, w2).
	workerReconnect  time.Duration
	workerReconnects []time.Duration
}

func newRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	bin := troupeBinary(t)
	for _, b := range []string{"redis-server", "nats-server"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed", b)
		}
	}
	r := &rig{t: t, dir: t.TempDir(), redisPort: freePort(t), natsPort: freePort(t),
		jobs: suiteEnvInt("TROUPE_FAULTS_JOBS", suiteJobsDefault), rate: suiteEnvInt("TROUPE_FAULTS_RATE", suiteRateDefault),
		sampleStop: make(chan struct{}), sampleWG: make(chan struct{})}
	t.Cleanup(r.stopAll)

	redisArgs := []string{"--port", strconv.Itoa(r.redisPort), "--bind", "127.0.0.1", "--save", "", "--dir", r.dir}
	if o.redisAOF {
		redisArgs = append(redisArgs, "--appendonly", "yes", "--appendfsync", "everysec")
	} else {
		redisArgs = append(redisArgs, "--appendonly", "no")
	}
	r.redis = &proc{name: "redis", bin: "redis-server", args: redisArgs, log: filepath.Join(r.dir, "redis.log")}
	r.redis.start(t)
	r.nats = &proc{name: "nats", bin: "nats-server", log: filepath.Join(r.dir, "nats.log"),
		args: []string{"-a", "127.0.0.1", "-p", strconv.Itoa(r.natsPort), "-js", "-sd", filepath.Join(r.dir, "js")}}
	r.nats.start(t)
	waitPort(t, r.redisPort)
	waitPort(t, r.natsPort)

	var safetyArgs []string
	if o.kernel {
		r.kernelPort = freePort(t)
		policy := filepath.Join(r.dir, "policy.yaml")
		if err := os.WriteFile(policy, []byte("rules:\n  - id: all\n    match: {topics: [\"job.*\"]}\n    decision: allow\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		r.kernel = &proc{name: "kernel", bin: bin, log: filepath.Join(r.dir, "kernel.log"),
			args: []string{"safety", "serve", "--policy", policy, "--listen", "127.0.0.1:" + strconv.Itoa(r.kernelPort)}}
		r.kernel.start(t)
		waitPort(t, r.kernelPort)
		safetyArgs = []string{"--safety-addr", "127.0.0.1:" + strconv.Itoa(r.kernelPort)}
	}
	timeouts := filepath.Join(r.dir, "timeouts.yaml")
	if err := os.WriteFile(timeouts, []byte(fmt.Sprintf("reconciler: {dispatch_timeout_seconds: %d, running_timeout_seconds: %d}\n",
		int(suiteDispatch/time.Second), int(suiteRunning/time.Second))), 0o644); err != nil {
		t.Fatal(err)
	}
	natsURL, redisURL := r.natsURL(), "redis://127.0.0.1:"+strconv.Itoa(r.redisPort)
	for i := 1; i <= suiteNodes; i++ {
		id := fmt.Sprintf("n%d", i)
		adminPort := freePort(t)
		r.adminPorts = append(r.adminPorts, adminPort)
		args := append([]string{"node", "--id", id, "--nats", natsURL, "--redis", redisURL, "--lock-ttl", suiteLockTTL.String(),
			"--timeouts", timeouts, "--admin-listen", "127.0.0.1:" + strconv.Itoa(adminPort), "--log-level", suiteLogLevel("TROUPE_FAULTS_NODE_LOG_LEVEL")}, safetyArgs...)
		n := &proc{name: id, bin: bin, args: args, log: filepath.Join(r.dir, id+".log")}
		n.start(t)
		r.nodes = append(r.nodes, n)
	}
	hold := o.workerHold
	if hold == 0 {
		hold = suiteWorkerSleep
	}
	for i := 1; i <= 2; i++ {
		id := fmt.Sprintf("w%d", i)
		w := &proc{name: id, bin: bin, log: filepath.Join(r.dir, id+".log"),
			args: []string{"worker", "--id", id, "--nats", natsURL, "--topics", "job.echo", "--handler", "sleep",
				"--sleep", hold.String(), "--max-parallel", "500", "--heartbeat", "500ms",
				"--receipts", filepath.Join(r.dir, id+".receipts"), "--log-level", suiteLogLevel("TROUPE_FAULTS_WORKER_LOG_LEVEL")}}
		wait := o.workerReconnect
		if len(o.workerReconnects) >= i {
			wait = o.workerReconnects[i-1]
		}
		if wait > 0 {
			w.args = append(w.args, "--reconnect-wait", wait.String())
		}
		w.start(t)
		r.workers = append(r.workers, w)
	}

	opt, _ := redis.ParseURL(redisURL)
	opt.MaxRetries = -1
	r.rdb = redis.NewClient(opt)
	r.st = store.New(r.rdb, store.Config{})
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	r.nc = nc
	r.js, _ = jetstream.New(nc)
	r.subj = bus.NewSubjects("")
	r.warmUp()
	return r
}

func (r *rig) natsURL() string { return "nats://127.0.0.1:" + strconv.Itoa(r.natsPort) }

func (r *rig) stopAll() {
	select {
	case <-r.sampleStop:
	default:
		close(r.sampleStop)
	}
	for _, p := range append(append([]*proc{}, r.workers...), r.nodes...) {
		p.kill()
	}
	for _, p := range []*proc{r.kernel, r.nats, r.redis} {
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
		keepLogs(r.t, r.dir)
		for _, p := range append(append([]*proc{}, r.nodes...), r.workers...) {
			if b, err := os.ReadFile(p.log); err == nil {
				if len(b) > 4000 {
					b = b[len(b)-4000:]
				}
				r.t.Logf("%s log (tail):\n%s", p.name, b)
			}
		}
	}
}

// keepLogs copies a failed run's logs and receipts (not the stores) into a
// fresh folder under TROUPE_FAULTS_KEEP, when that is set.
func keepLogs(t *testing.T, dir string) {
	root := os.Getenv("TROUPE_FAULTS_KEEP")
	if root == "" {
		return
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Logf("keep logs: %v", err)
		return
	}
	dst, err := os.MkdirTemp(root, strings.ReplaceAll(t.Name(), "/", "_")+"-")
	if err != nil {
		t.Logf("keep logs: %v", err)
		return
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil {
			_ = os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644)
		}
	}
	t.Logf("logs kept in %s", dst)
}

// warmUp waits until the nodes made their streams and both workers take
// jobs: a probe job per worker must succeed.
func (r *rig) warmUp() {
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := r.js.Stream(ctx, bus.StreamName("TROUPE", bus.StreamSubmit)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			r.t.Fatal("the nodes never created their streams")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := 0; i < 20; i++ {
		r.publish(fmt.Sprintf("probe-%d", i))
	}
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("probe-%d", i)
		for {
			rec, err := r.st.GetJob(ctx, id)
			if err == nil && rec.State == jobstate.StateSucceeded {
				break
			}
			if time.Now().After(deadline) {
				r.t.Fatalf("probe %s never succeeded: %+v %v", id, rec, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// Both workers must be in the registry (each took a probe, or at
	// least beat): wait until both receipt logs exist or a heartbeat has
	// surely been seen.
	time.Sleep(time.Second)
}

func (r *rig) jobID(i int) string { return "fs-" + strconv.Itoa(i) }

// publish submits one job, retrying while NATS is unreachable as a real
// client would (a duplicate submit changes nothing).
func (r *rig) publish(id string) {
	if err := submitRetrying(r.js, r.subj.Submit, "fault-suite", id, 300); err != nil {
		r.t.Error(err)
	}
}

// submitRetrying publishes a job request for id on subject, retrying every
// 100 ms up to tries times while JetStream does not take it.
func submitRetrying(js jetstream.JetStream, subject, sender, id string, tries int) error {
	data, _ := bus.EncodeRequest(id, sender, &capv1.JobRequest{JobId: id, Topic: "job.echo"})
	for try := 0; try < tries; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.Publish(ctx, subject, data)
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("could not submit %s in %d tries", id, tries)
}

// submitAll submits r.jobs jobs at r.rate per second in the background.
func (r *rig) submitAll() <-chan time.Duration {
	done := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		every := time.Second / time.Duration(r.rate)
		for i := 0; i < r.jobs; i++ {
			if d := time.Until(start.Add(time.Duration(i) * every)); d > 0 {
				time.Sleep(d)
			}
			r.publish(r.jobID(i))
		}
		done <- time.Since(start)
	}()
	return done
}

// sampleTerminal records the count of terminal suite jobs every 100 ms.
func (r *rig) sampleTerminal() {
	go func() {
		defer close(r.sampleWG)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.sampleStop:
				return
			case now := <-tick.C:
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				counts, err := r.st.CountStates(ctx, terminalStates...)
				cancel()
				if err != nil {
					continue // Redis is down: no sample
				}
				var n int64
				for _, c := range counts {
					n += c
				}
				r.samplesMu.Lock()
				r.samples = append(r.samples, sample{at: now, terminal: n - 20}) // minus the probes
				r.samplesMu.Unlock()
			}
		}
	}()
}

// waitAllTerminal waits until the count of terminal jobs reaches r.jobs.
func (r *rig) waitAllTerminal(within time.Duration) time.Time {
	deadline := time.Now().Add(within)
	for {
		r.samplesMu.Lock()
		var last sample
		if len(r.samples) > 0 {
			last = r.samples[len(r.samples)-1]
		}
		r.samplesMu.Unlock()
		if last.terminal >= int64(r.jobs) {
			return last.at
		}
		if time.Now().After(deadline) {
			r.t.Errorf("only %d of %d jobs terminal within %v", last.terminal, r.jobs, within)
			return time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// throughput is the rate of jobs reaching a terminal state between from
// and to, from the samples.
func (r *rig) throughput(from, to time.Time) float64 {
	r.samplesMu.Lock()
	defer r.samplesMu.Unlock()
	var a, b *sample
	for i := range r.samples {
		s := &r.samples[i]
		if a == nil && !s.at.Before(from) {
			a = s
		}
		if !s.at.After(to) {
			b = s
		}
	}
	if a == nil || b == nil || !b.at.After(a.at) {
		return 0
	}
	return float64(b.terminal-a.terminal) / b.at.Sub(a.at).Seconds()
}

// longestStall is the longest span between two samples at which the count
// of terminal jobs went up, while some were still outstanding. A span with
// no samples at all (Redis down) counts as a stall.
func (r *rig) longestStall() time.Duration {
	r.samplesMu.Lock()
	defer r.samplesMu.Unlock()
	var longest time.Duration
	var since time.Time
	var last int64 = -1
	for _, s := range r.samples {
		if s.terminal == last {
			continue
		}
		if last >= 0 {
			if d := s.at.Sub(since); d > longest {
				longest = d
			}
		}
		last, since = s.terminal, s.at
		if s.terminal >= int64(r.jobs) {
			break
		}
	}
	return longest
}

// receipts reads the workers' receipt logs: per worker, job id → runs, and
// the number of repeated deliveries the workers deduped ("dup <id>" lines).
func (r *rig) receipts() (map[string]map[string]int, int) {
	out := map[string]map[string]int{}
	dups := 0
	for _, w := range r.workers {
		m := map[string]int{}
		f, err := os.Open(filepath.Join(r.dir, w.name+".receipts"))
		if err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				line := strings.TrimSpace(sc.Text())
				if id, ok := strings.CutPrefix(line, "dup "); ok && strings.HasPrefix(id, "fs-") {
					dups++
				} else if strings.HasPrefix(line, "fs-") {
					m[line]++
				}
			}
			f.Close()
		}
		out[w.name] = m
	}
	return out, dups
}

// verdict checks every job's final record and the receipts, and returns a
// summary. allowed says which non-SUCCEEDED outcomes a job may have.
type verdict struct {
	states       map[jobstate.State]int
	lost         int
	sameWorker   int      // jobs a worker ran more than once (a worker logs a run once per job: it dedupes)
	deduped      int      // repeated deliveries a worker recognised and did not run
	crossWorkers int      // jobs that reached two different workers
	crossIDs     []string // their ids
	deniedOutage int
	notSucceeded []string        // "<id> <state> <reason>", dispatch-lost jobs excepted
	received     map[string]bool // job ids some worker received
	// dispatchLost counts jobs that ended TIMEOUT (dispatch_timeout)
	// without any worker receiving them: every publish of their dispatch
	// (a core NATS publish, repeated to deduping workers) was lost.
	dispatchLost int
}

func (r *rig) verify() verdict {
	ctx := context.Background()
	v := verdict{states: map[jobstate.State]int{}}
	for i := 0; i < r.jobs; i++ {
		id := r.jobID(i)
		rec, err := r.st.GetJob(ctx, id)
		if err != nil {
			v.lost++
			r.t.Errorf("%s: no record: %v", id, err)
			continue
		}
		v.states[rec.State]++
		if !rec.State.Terminal() {
			r.t.Errorf("%s still %s (%s)", id, rec.State, rec.Reason)
		}
		if rec.State == jobstate.StateDenied {
			v.deniedOutage++ // the suite's policy allows everything
		}
		if rec.State != jobstate.StateSucceeded {
			v.notSucceeded = append(v.notSucceeded, id+" "+string(rec.State)+" "+string(rec.Reason))
		}
	}
	seen := map[string]string{}
	v.received = map[string]bool{}
	runs, dups := r.receipts()
	v.deduped = dups
	for w, m := range runs {
		for id, n := range m {
			if n > 1 {
				v.sameWorker++
			}
			if other, ok := seen[id]; ok && other != w {
				v.crossWorkers++
				v.crossIDs = append(v.crossIDs, id)
			}
			seen[id] = w
			v.received[id] = true
		}
	}
	kept := v.notSucceeded[:0]
	for _, desc := range v.notSucceeded {
		id, rest, _ := strings.Cut(desc, " ")
		if !v.received[id] && rest == string(jobstate.StateTimeout)+" "+string(jobstate.ReasonDispatchTimeout) {
			v.dispatchLost++
			continue
		}
		kept = append(kept, desc)
	}
	v.notSucceeded = kept
	for _, id := range v.crossIDs {
		if rec, err := r.st.GetJob(ctx, id); err == nil {
			r.t.Logf("%s reached w1 and w2: %s", id, hops(rec))
		}
	}
	return v
}

// requireSucceeded fails t unless every job SUCCEEDED and none reached two
// workers. A dispatch lost on the way (see verdict) fails it too: the
// suite's workers dedupe by job id, so the node repeats a direct dispatch
// that shows no sign of arriving.
func (v verdict) requireSucceeded(t *testing.T) {
	t.Helper()
	if v.crossWorkers != 0 {
		t.Errorf("%d jobs reached two workers", v.crossWorkers)
	}
	if v.dispatchLost != 0 {
		t.Errorf("%d jobs timed out in DISPATCHED without reaching a worker", v.dispatchLost)
	}
	for _, desc := range v.notSucceeded {
		t.Errorf("%s: did not succeed", desc)
	}
}

func (v verdict) String() string {
	var parts []string
	for s, n := range v.states {
		parts = append(parts, fmt.Sprintf("%s=%d", s, n))
	}
	sort.Strings(parts)
	return fmt.Sprintf("states {%s}, lost %d, run twice by one worker %d, repeated deliveries deduped %d, reached two workers %d, DENIED %d, dispatch lost (TIMEOUT, never received) %d",
		strings.Join(parts, " "), v.lost, v.sameWorker, v.deduped, v.crossWorkers, v.deniedOutage, v.dispatchLost)
}

// runScenario runs the common shape: submit, break something a quarter of
// the way through the submissions (inject returns when the fault is over),
// then check everything.
func runScenario(t *testing.T, o rigOptions, name string,
	inject func(r *rig) (faultStart, faultEnd time.Time, note string)) (*rig, verdict) {
	if os.Getenv("TROUPE_FAULTS") == "" {
		t.Skip("the fault suite runs with TROUPE_FAULTS=1 (make test-faults)")
	}
	r := newRig(t, o)
	r.sampleTerminal()
	start := time.Now()
	submitted := r.submitAll()
	time.Sleep(time.Duration(r.jobs) * time.Second / time.Duration(r.rate) / 4)
	fs, fe, note := inject(r)
	subTime := <-submitted
	allDone := r.waitAllTerminal(suiteSettle)
	v := r.verify()
	total := allDone.Sub(start)
	t.Logf("%s: %d jobs at %d/s (submitted in %v); all terminal %v after the first submit, %v after the fault ended; %s",
		name, r.jobs, r.rate, subTime.Round(time.Millisecond), total.Round(time.Millisecond),
		allDone.Sub(fe).Round(time.Millisecond), v)
	t.Logf("%s: throughput during the fault (%v) %.0f jobs/s, overall %.0f jobs/s, longest stall %v; %s",
		name, fe.Sub(fs).Round(time.Millisecond), r.throughput(fs, fe), float64(r.jobs)/total.Seconds(),
		r.longestStall().Round(100*time.Millisecond), note)
	t.Logf("%s: dispatches repeated by the nodes still alive (troupe_dispatch_resent_total): %.0f; workers evicted (troupe_workers_evicted_total): %.0f",
		name, r.sumCounter("troupe_dispatch_resent_total"), r.sumCounter("troupe_workers_evicted_total"))
	if v.lost != 0 {
		t.Errorf("%d jobs lost", v.lost)
	}
	if v.sameWorker != 0 {
		t.Errorf("%d jobs reached the same worker twice", v.sameWorker)
	}
	if v.deniedOutage != 0 {
		t.Errorf("%d jobs DENIED during an outage (the policy allows all)", v.deniedOutage)
	}
	return r, v
}

// (a) kill -9 one of three nodes mid-run.
func TestFaultSuiteKillNode(t *testing.T) {
	var owned []string
	r, v := runScenario(t, rigOptions{workerHold: 200 * time.Millisecond}, "kill -9 a node",
		func(r *rig) (time.Time, time.Time, string) {
			r.nodes[0].kill()
			killed := time.Now()
			// Nothing changes the dead node's jobs before its lock TTL
			// runs out, so listing them after the kill is exact.
			owned = r.inFlightOwnedBy("n1")
			// The fault lasts until every job the dead node held is
			// terminal (adopted by a survivor and finished).
			adopted := r.waitTerminal(owned, 2*time.Minute)
			return killed, killed.Add(adopted), fmt.Sprintf("the killed node held %d in-flight jobs; all terminal %v after the kill (lock TTL %v)",
				len(owned), adopted.Round(time.Millisecond), suiteLockTTL)
		})
	if len(owned) == 0 {
		t.Error("the killed node held no job in flight; the scenario proved nothing")
	}
	if n := r.sumCounter("troupe_adoption_latency_seconds_count"); n > 0 {
		t.Logf("kill -9 a node: %.0f orphans adopted by the due pollers, %.2f s on average after their lock lapsed",
			n, r.sumCounter("troupe_adoption_latency_seconds_sum")/n)
	}
	v.requireSucceeded(t)
}

// (b) stop Redis (SIGTERM: it writes its append-only file) for 5 s, then
// start it again.
func TestFaultSuiteRedisRestart(t *testing.T) {
	_, v := runScenario(t, rigOptions{redisAOF: true}, "Redis stopped 5 s",
		func(r *rig) (time.Time, time.Time, string) {
			r.redis.term()
			down := time.Now()
			time.Sleep(5 * time.Second)
			r.redis.start(r.t)
			waitPort(r.t, r.redisPort)
			return down, time.Now(), "Redis down (SIGTERM, restart from its AOF) for " + time.Since(down).Round(time.Millisecond).String()
		})
	v.requireSucceeded(t)
}

// (c) restart the NATS server (its JetStream store survives). The workers
// wait 4 s between reconnect attempts and the nodes 250 ms, so for a few
// seconds the nodes dispatch to subjects nobody listens on: those
// dispatches are lost and must be repeated.
func TestFaultSuiteNATSRestart(t *testing.T) {
	natsOutage(t, "NATS restarted", "SIGTERM", func(p *proc) { p.term() })
}

// (c') kill -9 the NATS server: what it held in memory for subscribers is
// gone, and the workers come back later than the nodes (as in (c)).
func TestFaultSuiteNATSKill(t *testing.T) {
	natsOutage(t, "NATS killed", "kill -9", func(p *proc) { p.kill() })
}

// (c3) kill -9 the NATS server while the workers come back apart: w1
// reconnects every 250 ms, w2 waits 8 s between attempts, longer than its
// liveness window (2 s) after w1 speaks again. w2 may have received jobs
// just before the kill and run them while cut off, their start and result
// queued in its client: evicting it would place those on w1 too. Its
// silence began with the bus's, so no node evicts it
// (router.StallReconnect, 10 s after the stall); every job runs on one
// worker and succeeds.
func TestFaultSuiteNATSKillWorkerBackLate(t *testing.T) {
	r, v := runScenario(t, rigOptions{workerReconnects: []time.Duration{250 * time.Millisecond, 8 * time.Second}},
		"NATS killed, w2 back late", func(r *rig) (time.Time, time.Time, string) {
			r.nats.kill()
			down := time.Now()
			time.Sleep(time.Second)
			r.nats.start(r.t)
			waitPort(r.t, r.natsPort)
			return down, time.Now(), "nats-server down (kill -9, restart) for " + time.Since(down).Round(time.Millisecond).String() +
				"; w2 reconnects 8 s apart"
		})
	v.requireSucceeded(t)
	if n := r.sumCounter("troupe_workers_evicted_total"); n != 0 {
		t.Errorf("%.0f evictions of a worker silent since the bus stalled, back within router.StallReconnect", n)
	}
}

// natsOutage stops the NATS server with stop, starts it again a second
// later, and requires every job to succeed.
func natsOutage(t *testing.T, name, how string, stop func(*proc)) {
	_, v := runScenario(t, rigOptions{workerReconnect: 4 * time.Second}, name,
		func(r *rig) (time.Time, time.Time, string) {
			stop(r.nats)
			down := time.Now()
			time.Sleep(time.Second)
			r.nats.start(r.t)
			waitPort(r.t, r.natsPort)
			return down, time.Now(), "nats-server down (" + how + ", restart) for " + time.Since(down).Round(time.Millisecond).String()
		})
	v.requireSucceeded(t)
}

// (d) kill -9 a worker holding jobs. The jobs it had started (RUNNING) end
// in TIMEOUT after the running deadline; the ones it had not started are
// dispatched again to the other worker once it is evicted.
func TestFaultSuiteKillWorker(t *testing.T) {
	var held map[string]int
	_, v := runScenario(t, rigOptions{workerHold: 500 * time.Millisecond}, "kill -9 a worker",
		func(r *rig) (time.Time, time.Time, string) {
			r.workers[0].kill()
			killed := time.Now()
			runs, _ := r.receipts()
			held = runs["w1"]
			var heldIDs []string
			for id := range held {
				heldIDs = append(heldIDs, id)
			}
			took := r.waitTerminal(heldIDs, suiteRunning+time.Minute)
			return killed, killed.Add(took), fmt.Sprintf("the killed worker had received %d jobs; all of those terminal %v after the kill (running deadline %v)",
				len(held), took.Round(time.Millisecond), suiteRunning)
		})
	// A job may end other than SUCCEEDED only if the dead worker had it.
	for _, desc := range v.notSucceeded {
		if id, _, _ := strings.Cut(desc, " "); held[id] == 0 {
			t.Errorf("%s: did not succeed and never reached the killed worker", desc)
		}
	}
	t.Logf("kill -9 a worker: %d jobs the dead worker held ended other than SUCCEEDED; %d reached both workers (re-dispatched after eviction)",
		len(v.notSucceeded), v.crossWorkers)
}

// (e) the safety kernel is down for 20 s: jobs wait (fail closed), none is
// DENIED, and all succeed once it is back.
func TestFaultSuiteKernelDown(t *testing.T) {
	_, v := runScenario(t, rigOptions{kernel: true}, "safety kernel down 20 s",
		func(r *rig) (time.Time, time.Time, string) {
			r.kernel.kill()
			down := time.Now()
			time.Sleep(20 * time.Second)
			r.kernel.start(r.t)
			waitPort(r.t, r.kernelPort)
			return down, time.Now(), "kernel down (kill -9, restart) for " + time.Since(down).Round(time.Millisecond).String()
		})
	v.requireSucceeded(t)
}

// sumCounter adds up a counter, over its labels and the nodes that answer
// on their admin port (a killed node does not).
func (r *rig) sumCounter(name string) float64 {
	total := 0.0
	client := &http.Client{Timeout: 2 * time.Second}
	for _, port := range r.adminPorts {
		resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			rest, ok := strings.CutPrefix(sc.Text(), name)
			if !ok || !strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{") {
				continue
			}
			fields := strings.Fields(rest)
			f, _ := strconv.ParseFloat(fields[len(fields)-1], 64)
			total += f
		}
		resp.Body.Close()
	}
	return total
}

// inFlightOwnedBy lists the suite's non-terminal jobs whose record names
// node as owner (one pipeline of HMGETs).
func (r *rig) inFlightOwnedBy(node string) []string {
	ctx := context.Background()
	pipe := r.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, r.jobs)
	for i := range cmds {
		cmds[i] = pipe.HMGet(ctx, r.st.Keys().Job(r.jobID(i)), "s", "node", "h1")
	}
	_, _ = pipe.Exec(ctx)
	var ids []string
	for i, c := range cmds {
		v, err := c.Result()
		if err != nil || len(v) != 3 {
			continue
		}
		st, _ := v[0].(string)
		owner, _ := v[1].(string)
		if h1, _ := v[2].(string); owner == "" && h1 != "" {
			// A record never adopted has no "node": its creator, the
			// first hop's node, owns it (store.ExpandRecord).
			owner = h1[strings.LastIndexByte(h1, '|')+1:]
		}
		if owner == node && st != "" && !jobstate.State(st).Terminal() {
			ids = append(ids, r.jobID(i))
		}
	}
	return ids
}

// waitTerminal waits until every job in ids is terminal and returns how
// long that took.
func (r *rig) waitTerminal(ids []string, within time.Duration) time.Duration {
	ctx := context.Background()
	start := time.Now()
	deadline := start.Add(within)
	for _, id := range ids {
		for {
			rec, err := r.st.GetJob(ctx, id)
			if err == nil && rec.State.Terminal() {
				break
			}
			if time.Now().After(deadline) {
				r.t.Errorf("%s not terminal %v after the fault: %+v %v", id, within, rec, err)
				return time.Since(start)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return time.Since(start)
}
