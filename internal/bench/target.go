package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/troupe-run/troupe/internal/logx"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sync"
	"time"
)

// target is the bench's handle on the system under test, wherever it runs.
type target interface {
	// pid is the process the node runs in (0 when unknown).
	pid() int
	// scope says what the CPU and RSS figures cover.
	scope() string
	// workers is how many workers the node sees, or errNoWorkerView.
	workers(ctx context.Context) (int, error)
	// snap reads the counters; fields the target cannot see stay zero and
	// have says which are set.
	snap(ctx context.Context) (Snap, snapHas, error)
	// inflight is a snap after a GC with the resident set, live heap, live
	// actors and parked jobs (hold runs).
	inflight(ctx context.Context) (Snap, error)
	// heapProfile writes the node's heap profile (after a GC) to path.
	heapProfile(path string) error
	startProfile(path string) error
	stopProfile() error
	stop(ctx context.Context) error
}

// snapHas says which Snap fields a target could read.
type snapHas struct {
	CPU, RSS, Redis, NATS, Mem bool
}

var errNoWorkerView = errors.New("bench: the node's worker view is not reachable from the bench")

// Scopes of the CPU and RSS figures.
const (
	scopeChild    = "node process (a child of the bench)"
	scopeInProc   = "bench process (node and harness together)"
	scopeExternal = "external node process (--node-pid)"
)

// ---- in-process -------------------------------------------------------------

type inprocTarget struct {
	s    *sut
	prof *os.File
}

func startInProc(ctx context.Context, spec sutSpec, log *slog.Logger) (*inprocTarget, error) {
	s, err := startSUT(ctx, spec, log)
	if err != nil {
		return nil, err
	}
	return &inprocTarget{s: s}, nil
}

func (t *inprocTarget) pid() int      { return os.Getpid() }
func (t *inprocTarget) scope() string { return scopeInProc }
func (t *inprocTarget) workers(context.Context) (int, error) {
	return t.s.workers()
}
func (t *inprocTarget) snap(context.Context) (Snap, snapHas, error) {
	sn := t.s.counters()
	sn.CPU = selfCPU()
	sn.PeakRSS, _ = procPeakRSS(os.Getpid())
	return sn, snapHas{CPU: true, RSS: true, Redis: true, NATS: true, Mem: true}, nil
}
func (t *inprocTarget) inflight(ctx context.Context) (Snap, error) { return t.s.inflight(ctx), nil }
func (t *inprocTarget) heapProfile(path string) error              { return writeHeapProfile(path) }
func (t *inprocTarget) startProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return err
	}
	t.prof = f
	return nil
}
func (t *inprocTarget) stopProfile() error {
	if t.prof == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := t.prof.Close()
	t.prof = nil
	return err
}
func (t *inprocTarget) stop(ctx context.Context) error {
	_ = t.stopProfile()
	t.s.stop(ctx)
	return nil
}

// ---- external ---------------------------------------------------------------

// externalTarget is a node the user started. The bench only submits and
// observes; with --node-pid it also reads the node's CPU and RSS from /proc.
type externalTarget struct{ nodePID int }

func (t *externalTarget) pid() int      { return t.nodePID }
func (t *externalTarget) scope() string { return scopeExternal }
func (t *externalTarget) workers(context.Context) (int, error) {
	return 0, errNoWorkerView
}
func (t *externalTarget) snap(context.Context) (Snap, snapHas, error) {
	if t.nodePID <= 0 {
		return Snap{}, snapHas{}, nil
	}
	cpu, err := procCPU(t.nodePID)
	if err != nil {
		return Snap{}, snapHas{}, fmt.Errorf("bench: node pid %d: %w", t.nodePID, err)
	}
	rss, _ := procPeakRSS(t.nodePID)
	return Snap{CPU: cpu, PeakRSS: rss}, snapHas{CPU: true, RSS: rss > 0}, nil
}
func (t *externalTarget) inflight(context.Context) (Snap, error) {
	if t.nodePID <= 0 {
		return Snap{}, errors.New("bench: no --node-pid")
	}
	rss, err := procRSS(t.nodePID)
	return Snap{RSS: rss}, err
}
func (t *externalTarget) heapProfile(string) error {
	return errors.New("bench: a heap profile needs a node the bench starts (child or inproc)")
}
func (t *externalTarget) startProfile(string) error {
	return errors.New("bench: --cpuprofile needs a node the bench starts (child or inproc)")
}
func (t *externalTarget) stopProfile() error         { return nil }
func (t *externalTarget) stop(context.Context) error { return nil }

// ---- child process ----------------------------------------------------------

// The child protocol is JSON lines over the child's stdin and stdout. The
// parent sends a sutSpec, the child answers childReply{Ready}; then each
// childCmd gets one childReply. EOF on stdin (the parent is gone) stops the
// child, so a killed bench never leaves a node behind.
type childCmd struct {
	Cmd  string `json:"cmd"` // snap, inflight, workers, prof_start, prof_stop, stop
	Path string `json:"path,omitempty"`
}

type childReply struct {
	Ready   bool   `json:"ready,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Snap    *Snap  `json:"snap,omitempty"`
	Workers int    `json:"workers,omitempty"`
	Error   string `json:"error,omitempty"`
}

// nodeProcsEnv names the environment variable whose value, when set,
// becomes the GOMAXPROCS of the node children (not of the bench process,
// its workers, or the servers it starts): how many cores one node uses on a
// many-core host.
const nodeProcsEnv = "TROUPE_BENCH_NODE_GOMAXPROCS"

// childStartTimeout bounds the child's start (dial, streams, scripts).
const childStartTimeout = 30 * time.Second

// childCallTimeout bounds one command's answer.
const childCallTimeout = 15 * time.Second

type childTarget struct {
	cmd  *exec.Cmd // nil when the child is not a process of ours (tests)
	in   io.WriteCloser
	out  *bufio.Reader
	mu   sync.Mutex // one call at a time
	done chan error // the child's exit
	node int        // the child's pid, from its ready reply
}

// startChild runs argv (the bench binary's hidden serve command) and starts
// spec's system in it.
func startChild(argv []string, spec sutSpec, stderr io.Writer) (*childTarget, error) {
	if len(argv) == 0 {
		return nil, errors.New("bench: child mode needs the command that serves a child (Config.ChildCommand)")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = stderr
	if procs := os.Getenv(nodeProcsEnv); procs != "" {
		// The node's own GOMAXPROCS, the bench's and the servers' left alone.
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+procs)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start child %s: %w", argv[0], err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t, err := connectChild(in, out, done, spec)
	if err != nil {
		_ = in.Close()
		_ = cmd.Process.Kill()
		select {
		case <-done:
		case <-time.After(childKillWait):
		}
		return nil, err
	}
	t.cmd = cmd
	return t, nil
}

// childKillWait bounds the wait for a killed child to be reaped.
const childKillWait = 5 * time.Second

// connectChild speaks the child protocol over in and out: it sends spec and
// waits for the child to report ready. done delivers the child's exit.
func connectChild(in io.WriteCloser, out io.Reader, done chan error, spec sutSpec) (*childTarget, error) {
	t := &childTarget{in: in, out: bufio.NewReaderSize(out, 1<<16), done: done}
	line, _ := json.Marshal(spec)
	var rep childReply
	if err := t.roundTrip(append(line, '\n'), &rep, childStartTimeout); err != nil {
		return nil, fmt.Errorf("bench: child did not start: %w", err)
	}
	if !rep.Ready {
		return nil, fmt.Errorf("bench: child: %s", rep.Error)
	}
	t.node = rep.PID
	return t, nil
}

// roundTrip writes line and reads one reply, bounded by timeout and by the
// child's exit. After a timeout the protocol is out of step (a late reply
// would answer the next call), so callers treat it as the child being lost.
func (t *childTarget) roundTrip(line []byte, rep *childReply, timeout time.Duration) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, err := t.in.Write(line); err != nil {
		return err
	}
	got := make(chan error, 1)
	go func() {
		b, err := t.out.ReadBytes('\n')
		if err != nil {
			got <- err
			return
		}
		got <- json.Unmarshal(b, rep)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-got:
		return err
	case err := <-t.done:
		t.done <- err
		// A child may answer and then exit (stop does): its reply is in
		// the pipe, which its exit closed, so the reader ends at once.
		select {
		case rerr := <-got:
			if rerr == nil {
				return nil
			}
		case <-time.After(time.Second):
		}
		return fmt.Errorf("child exited: %v", err)
	case <-timer.C:
		return fmt.Errorf("no answer within %s", timeout)
	}
}

func (t *childTarget) call(c childCmd) (childReply, error) {
	line, _ := json.Marshal(c)
	var rep childReply
	if err := t.roundTrip(append(line, '\n'), &rep, childCallTimeout); err != nil {
		return rep, fmt.Errorf("bench: child %s: %w", c.Cmd, err)
	}
	if rep.Error != "" {
		return rep, fmt.Errorf("bench: child %s: %s", c.Cmd, rep.Error)
	}
	return rep, nil
}

func (t *childTarget) pid() int      { return t.node }
func (t *childTarget) scope() string { return scopeChild }
func (t *childTarget) workers(context.Context) (int, error) {
	rep, err := t.call(childCmd{Cmd: "workers"})
	return rep.Workers, err
}
func (t *childTarget) snap(context.Context) (Snap, snapHas, error) {
	rep, err := t.call(childCmd{Cmd: "snap"})
	if err != nil || rep.Snap == nil {
		return Snap{}, snapHas{}, err
	}
	return *rep.Snap, snapHas{CPU: true, RSS: true, Redis: true, NATS: true, Mem: true}, nil
}
func (t *childTarget) inflight(context.Context) (Snap, error) {
	rep, err := t.call(childCmd{Cmd: "inflight"})
	if err != nil || rep.Snap == nil {
		return Snap{}, err
	}
	return *rep.Snap, nil
}
func (t *childTarget) heapProfile(path string) error {
	_, err := t.call(childCmd{Cmd: "heap", Path: path})
	return err
}
func (t *childTarget) startProfile(path string) error {
	_, err := t.call(childCmd{Cmd: "prof_start", Path: path})
	return err
}
func (t *childTarget) stopProfile() error {
	_, err := t.call(childCmd{Cmd: "prof_stop"})
	return err
}

// childStopTimeout bounds a graceful stop before the child is killed.
const childStopTimeout = 20 * time.Second

func (t *childTarget) stop(context.Context) error {
	_, err := t.call(childCmd{Cmd: "stop"})
	_ = t.in.Close()
	select {
	case <-t.done:
	case <-time.After(childStopTimeout):
		t.kill()
		return fmt.Errorf("bench: child did not exit within %s; killed", childStopTimeout)
	}
	return err
}

func (t *childTarget) kill() {
	_ = t.in.Close()
	if t.cmd != nil {
		_ = t.cmd.Process.Kill()
	}
	select {
	case <-t.done:
	case <-time.After(childKillWait):
	}
}

// writeHeapProfile writes this process's heap profile after a GC.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// ServeArg is the hidden first argument with which the bench re-runs its
// own binary as the child process that hosts the node under test.
const ServeArg = "__serve"

// ServeChild is the child side of child mode: it reads a sutSpec from in,
// starts that system, and answers commands until "stop" or EOF. The bench
// binary runs it for `troupe-bench __serve`; logs go to stderr.
func ServeChild(ctx context.Context, in io.Reader, out io.Writer, stderr io.Writer) error {
	r := bufio.NewReader(in)
	enc := json.NewEncoder(out)
	line, err := r.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("bench child: read spec: %w", err)
	}
	var spec sutSpec
	if err := json.Unmarshal(line, &spec); err != nil {
		_ = enc.Encode(childReply{Error: "bad spec: " + err.Error()})
		return err
	}
	lv := slog.LevelWarn
	_ = lv.UnmarshalText([]byte(spec.LogLevel))
	log := slog.New(logx.LevelFloor(slog.NewTextHandler(stderr, nil), lv))
	if spec.MemoryLimit > 0 {
		debug.SetMemoryLimit(spec.MemoryLimit)
	}
	sctx, cancel := context.WithTimeout(ctx, childStartTimeout)
	s, err := startSUT(sctx, spec, log)
	cancel()
	if err != nil {
		_ = enc.Encode(childReply{Error: err.Error()})
		return err
	}
	defer s.stop(context.Background())
	if err := enc.Encode(childReply{Ready: true, PID: os.Getpid()}); err != nil {
		return err
	}
	stopUSR1 := heapProfilesOnSignal(ctx, os.Getenv(HeapDirEnv), log)
	defer stopUSR1()
	var prof *os.File
	defer func() {
		if prof != nil {
			pprof.StopCPUProfile()
			_ = prof.Close()
		}
	}()
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		for {
			b, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			lines <- b
		}
	}()
	for {
		var b []byte
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case b, ok = <-lines:
			if !ok {
				return nil // the parent is gone
			}
		}
		var c childCmd
		if err := json.Unmarshal(b, &c); err != nil {
			_ = enc.Encode(childReply{Error: "bad command: " + err.Error()})
			continue
		}
		var rep childReply
		switch c.Cmd {
		case "snap":
			sn := s.counters()
			sn.CPU = selfCPU()
			sn.PeakRSS, _ = procPeakRSS(os.Getpid())
			rep.Snap = &sn
		case "heap":
			if err := writeHeapProfile(c.Path); err != nil {
				rep.Error = err.Error()
			}
		case "inflight":
			sn := s.inflight(ctx)
			sn.CPU = selfCPU()
			sn.PeakRSS, _ = procPeakRSS(os.Getpid())
			rep.Snap = &sn
		case "workers":
			n, err := s.workers()
			rep.Workers = n
			if err != nil {
				rep.Error = err.Error()
			}
		case "prof_start":
			f, err := os.Create(c.Path)
			if err == nil {
				if err = pprof.StartCPUProfile(f); err != nil {
					_ = f.Close()
				} else {
					prof = f
				}
			}
			if err != nil {
				rep.Error = err.Error()
			}
		case "prof_stop":
			if prof != nil {
				pprof.StopCPUProfile()
				err := prof.Close()
				if err == nil {
					// Beside the CPU profile, where the node allocated
					// (since it started: warm-up included).
					err = writeAllocs(prof.Name() + ".allocs")
				}
				if err != nil {
					rep.Error = err.Error()
				}
				prof = nil
			}
		case "stop":
			sctx, cancel := context.WithTimeout(context.Background(), childStopTimeout)
			s.stop(sctx)
			cancel()
			s.node, s.fl = nil, nil
			_ = enc.Encode(childReply{})
			return nil
		default:
			rep.Error = "unknown command " + c.Cmd
		}
		if err := enc.Encode(rep); err != nil {
			return err
		}
	}
}

// writeAllocs writes the process's allocation profile to path.
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = pprof.Lookup("allocs").WriteTo(f, 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
