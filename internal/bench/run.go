package bench

import (
	"context"
	"errors"
	"fmt"
	"github.com/troupe-run/troupe/internal/logx"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// ErrRunFailed is returned (wrapped) with the Result of a run whose jobs did
// not all end SUCCEEDED exactly once.
var ErrRunFailed = errors.New("bench: run failed")

// Timing of the run's phases.
const (
	// workersVisibleTimeout bounds the wait for the node's router to list
	// every simulated worker (their first heartbeat is sent at start).
	workersVisibleTimeout = 15 * time.Second
	// warmupTimeout bounds the warm-up jobs.
	warmupTimeout = 30 * time.Second
	// pollSlow and pollFast space completion polls: slow while workers
	// still have jobs to receive, fast once every job was answered and only
	// the node's last writes remain. Neither is the measurement's clock.
	pollSlow = 50 * time.Millisecond
	pollFast = 5 * time.Millisecond
	// readTimeout bounds reading every job's record back.
	readTimeout = 60 * time.Second
	// cleanupTimeout bounds deleting the run's keys and streams.
	cleanupTimeout = 60 * time.Second
	// holdDispatchTimeout replaces the node's dispatch timeout in hold runs.
	holdDispatchTimeout = 2 * time.Hour
	// idleWindow is how long the node's idle CPU is read before the measured
	// jobs: long enough to cover its periodic work (renewal, fetch waits,
	// sweeps) at /proc's 10 ms and getrusage's µs resolution.
	idleWindow = time.Second
)

// Run runs one benchmark. The Result is returned whenever the run got as far
// as submitting; err wraps ErrRunFailed when the run completed but its jobs
// were not all SUCCEEDED exactly once (or it timed out).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, log: cfg.Log, pfx: PrefixesFor(cfg.RunID)}
	defer r.teardown()
	return r.run(ctx)
}

// Compare runs Troupe and then the floor with the same parameters, each on
// fresh prefixes, and reports both.
func Compare(ctx context.Context, cfg Config) (*Comparison, error) {
	tc, fc := cfg, cfg
	tc.Target, fc.Target = TargetTroupe, TargetFloor
	fc.Nodes = 1 // the floor is one process, whatever Troupe runs as
	if cfg.RunID != "" {
		tc.RunID, fc.RunID = cfg.RunID+"t", cfg.RunID+"f"
	}
	fc.CPUProfile = ""
	c := &Comparison{}
	var err1, err2 error
	c.Troupe, err1 = Run(ctx, tc)
	if c.Troupe == nil {
		return c, err1
	}
	c.Floor, err2 = Run(ctx, fc)
	if c.Floor != nil && c.Floor.JobsPerSec > 0 {
		c.OfFloor = math.Round(c.Troupe.JobsPerSec/c.Floor.JobsPerSec*1000) / 1000
	}
	return c, errors.Join(err1, err2)
}

// runner holds one run's connections and parts; everything it starts is
// stopped by teardown, in reverse order.
type runner struct {
	cfg  Config
	log  *slog.Logger
	pfx  Prefixes
	subj bus.Subjects

	rdb   redis.UniversalClient // the bench's own reads (counted, and subtracted); a cluster client with several addresses
	rc    *redisCounter
	st    *store.Store
	wconn *nats.Conn // the simulated workers
	sconn *nats.Conn // the submitter
	tgt   target
	spec  sutSpec // what the node under test was started with
	fl    *fleet
	tr    *tracker

	res *Result
}

func (r *runner) run(ctx context.Context) (*Result, error) {
	cfg := r.cfg
	r.subj = bus.NewSubjects(r.pfx.Subject)
	var err error
	if r.rdb, r.rc, err = newCountedClient(cfg.RedisURL); err != nil {
		return nil, fmt.Errorf("bench: redis url: %w", err)
	}
	if err := r.rdb.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("bench: redis %s: %w", logx.RedactURL(cfg.RedisURL), err)
	}
	r.st = store.New(r.rdb, store.Config{Prefix: r.pfx.Key})
	if r.wconn, err = nats.Connect(cfg.NATSURL, nats.Name("troupe-bench-workers")); err != nil {
		return nil, fmt.Errorf("bench: connect nats %s: %w", logx.RedactURL(cfg.NATSURL), err)
	}
	if r.sconn, err = nats.Connect(cfg.NATSURL, nats.Name("troupe-bench-submit")); err != nil {
		return nil, fmt.Errorf("bench: connect nats %s: %w", logx.RedactURL(cfg.NATSURL), err)
	}
	ms0 := readMasters(ctx, r.rdb)
	srv0 := sumServers(ms0)
	r.res = &Result{
		Target: cfg.Target, NodeMode: cfg.Node, RunID: cfg.RunID, Started: time.Now().UTC(),
		Params: Params{Jobs: cfg.Jobs, Workers: cfg.Workers, Rate: cfg.Rate, DelayMs: durMs(cfg.Delay),
			Warmup: cfg.Warmup, Topic: cfg.Topic, Window: cfg.SubmitWindow, Heartbeat: cfg.Heartbeat.String(),
			MaxParallel: cfg.announcedMaxParallel(), Nodes: cfg.Nodes,
			RedisMasters: len(ms0), WorkerMode: cfg.WorkerMode},
		Env: Env{Machine: describeMachine(), RedisVersion: orUnknown(srv0.version),
			NATSVersion: orUnknown(r.wconn.ConnectedServerVersion()), Git: gitDescribe(), LoadStart: loadAverage()},
	}
	if err := r.startTarget(ctx); err != nil {
		return nil, err
	}
	r.tr = newTracker(cfg.RunID+"-", cfg.RunID+"w-", cfg.Jobs)
	if r.fl, err = startFleet(r.wconn, r.subj, cfg.Workers, cfg.Pool, cfg.Topic, cfg.Delay, cfg.Heartbeat,
		cfg.announcedMaxParallel(), cfg.WorkerMode, r.tr, cfg.ConcurrencyKeys, cfg.KeyLimit); err != nil {
		return nil, err
	}
	r.fl.hold.Store(cfg.Hold) // measured jobs only: the warm-up is answered
	if err := r.waitWorkers(ctx); err != nil {
		return nil, err
	}
	sub, err := newSubmitter(r.sconn, r.subj.Submit, cfg.Topic, r.tr, cfg.SubmitWindow, cfg.SubmitBatch, cfg.Submitters)
	if err != nil {
		return nil, err
	}
	sub.keys = cfg.ConcurrencyKeys
	cnt := &counter{st: r.st}
	if err := cnt.baseline(ctx); err != nil {
		return nil, err
	}
	if err := r.warmup(ctx, sub, cnt); err != nil {
		return nil, err
	}
	if err := cnt.baseline(ctx); err != nil {
		return nil, err
	}
	return r.measure(ctx, sub, cnt)
}

func (r *runner) startTarget(ctx context.Context) error {
	cfg := r.cfg
	spec := sutSpec{Role: cfg.Target, RedisURL: cfg.RedisURL, NATSURL: cfg.NATSURL,
		KeyPrefix: r.pfx.Key, SubjectPrefix: r.pfx.Subject, StreamPrefix: r.pfx.Stream,
		Topic: cfg.Topic, Pool: cfg.Pool, NodeID: nodeIDs(cfg.RunID, 1)[0], WorkerIDs: workerIDs(cfg.Workers),
		LogLevel: cfg.NodeLogLevel, ParkAfter: cfg.ParkAfter, LockTTL: cfg.LockTTL, MemoryLimit: cfg.NodeMemoryLimit,
		CapacityGrace: cfg.CapacityGrace, MaxAdmitting: cfg.MaxAdmitting, PoolDispatch: cfg.WorkerMode == WorkerCAP, KeyLimit: cfg.KeyLimit}
	if cfg.Hold {
		// Held jobs stay DISPATCHED far longer than the default 300 s.
		spec.DispatchTimeout = holdDispatchTimeout
	}
	if cfg.keysUnenforced {
		spec.KeyLimit = 0
	}
	r.spec = spec
	if cfg.Nodes > 1 {
		lv := slog.LevelWarn
		_ = lv.UnmarshalText([]byte(cfg.NodeLogLevel))
		t, err := startNodes(ctx, cfg, spec, nodeIDs(cfg.RunID, cfg.Nodes), slog.New(logx.LevelFloor(r.log.Handler(), lv)))
		if err != nil {
			return err
		}
		r.tgt = t
		return nil
	}
	var err error
	switch cfg.Node {
	case NodeChild:
		r.tgt, err = startChild(cfg.ChildCommand, spec, cfg.Stderr)
	case NodeInProcess:
		lv := slog.LevelWarn
		_ = lv.UnmarshalText([]byte(cfg.NodeLogLevel))
		r.tgt, err = startInProc(ctx, spec, slog.New(logx.LevelFloor(r.log.Handler(), lv)))
	case NodeExternal:
		// The node must already run with this run's prefixes: its streams
		// are the proof.
		js, jerr := jetstream.New(r.sconn)
		if jerr != nil {
			return jerr
		}
		name := bus.StreamName(r.pfx.Stream, bus.StreamSubmit)
		if _, jerr := js.Stream(ctx, name); jerr != nil {
			return fmt.Errorf("bench: stream %s not found (%v): start the node first with\n  %s",
				name, jerr, NodeCommand(cfg.RunID))
		}
		r.tgt = &externalTarget{nodePID: cfg.NodePID}
	}
	return err
}

func (r *runner) waitWorkers(ctx context.Context) error {
	deadline := time.Now().Add(workersVisibleTimeout)
	for {
		n, err := r.tgt.workers(ctx)
		if errors.Is(err, errNoWorkerView) {
			return nil // external: the warm-up shows the node sees them
		}
		if err == nil && n >= r.cfg.Workers {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: the node sees %d of %d workers after %s (err %v)",
				n, r.cfg.Workers, workersVisibleTimeout, err)
		}
		sleepCtx(ctx, 10*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func (r *runner) warmup(ctx context.Context, sub *submitter, cnt *counter) error {
	if r.cfg.Warmup == 0 {
		return nil
	}
	ids := make([]string, r.cfg.Warmup)
	for i := range ids {
		ids[i] = r.cfg.RunID + "w-" + strconv.Itoa(i)
	}
	wctx, cancel := context.WithTimeout(ctx, warmupTimeout)
	defer cancel()
	if err := sub.warmup(wctx, ids); err != nil {
		return err
	}
	if err := cnt.waitCount(wctx, int64(len(ids)), warmupTimeout); err != nil {
		return fmt.Errorf("bench: warm-up: %w (is the node running with this run's prefixes and pools "+
			"mapping %s to %s?)", err, r.cfg.Topic, r.cfg.Pool)
	}
	return nil
}

// snapshot is every counter read at one instant.
type snapshot struct {
	node     Snap
	has      snapHas
	server   serverStats
	masters  []masterStats // per master (one entry for a single server); server is their sum
	harness  RedisCounts
	wIn      uint64
	wOut     uint64
	sIn      uint64
	sOut     uint64
	selfCPU  time.Duration
	natsCPU  time.Duration
	natsOK   bool
	natsPID  int
	nodeErrs error
}

func (r *runner) snapshot(ctx context.Context, natsPID int) snapshot {
	var s snapshot
	s.harness = r.rc.snapshot()
	s.node, s.has, s.nodeErrs = r.tgt.snap(ctx)
	s.masters = readMasters(ctx, r.rdb)
	s.server = sumServers(s.masters)
	ws, ss := r.wconn.Stats(), r.sconn.Stats()
	s.wIn, s.wOut, s.sIn, s.sOut = ws.InMsgs, ws.OutMsgs, ss.InMsgs, ss.OutMsgs
	s.selfCPU = selfCPU()
	if natsPID > 0 {
		if c, err := procCPU(natsPID); err == nil {
			s.natsCPU, s.natsOK, s.natsPID = c, true, natsPID
		}
	}
	return s
}

// settleWait bounds how long the run's end waits for the nodes' own
// counters to catch up with what the bench saw in Redis.
const settleWait = 2 * time.Second

// settleCompleted waits, at most settleWait, until the nodes' completed
// counters (troupe_jobs_completed_total, summed) have counted done jobs
// since before: the bench sees a terminal write in Redis as soon as it lands,
// the node counts it once the write's reply reaches the job's actor, so a
// snapshot taken at once could read a node one write batch short.
func (r *runner) settleCompleted(ctx context.Context, before Snap, done int64) {
	if before.Node == nil {
		return
	}
	limit := time.Now().Add(settleWait)
	for {
		now, _, err := r.tgt.snap(ctx)
		if err != nil || now.Node == nil || int64(now.Node.Completed-before.Node.Completed) >= done {
			return
		}
		if time.Now().After(limit) || ctx.Err() != nil {
			return
		}
		sleepCtx(ctx, pollFast)
	}
}

func (r *runner) measure(ctx context.Context, sub *submitter, cnt *counter) (*Result, error) {
	cfg, res := r.cfg, r.res
	natsPID := listenerPID(cfg.NATSURL)
	if natsPID == 0 {
		natsPID = findProcess("nats-server")
	}
	if natsPID == os.Getpid() {
		natsPID = 0 // an in-process server: its CPU is in the harness's
	}
	if s0, has, err := r.tgt.snap(ctx); err == nil && has.CPU {
		sleepCtx(ctx, idleWindow)
		if s1, _, err := r.tgt.snap(ctx); err == nil {
			res.Node.IdleCPUMsPerSec = round3(float64(s1.CPU-s0.CPU) / float64(time.Millisecond) / idleWindow.Seconds())
		}
	}
	if cfg.Hold {
		r.res.Hold = &HoldResult{}
		if sn, err := r.tgt.inflight(ctx); err == nil {
			r.res.Hold.IdleRSSBytes = sn.RSS
		}
		r.res.Hold.redisUsedBeforeRun, _ = usedMemory(ctx, r.rdb)
	}
	r.fl.resetCapacity()
	before := r.snapshot(ctx, natsPID)
	if cfg.CPUProfile != "" {
		if err := r.tgt.startProfile(cfg.CPUProfile); err != nil {
			return nil, fmt.Errorf("bench: cpu profile: %w", err)
		}
		res.Files.CPUProfile = cfg.CPUProfile
		if nt, ok := r.tgt.(*nodesTarget); ok && len(nt.profiles) > 0 {
			res.Files.CPUProfile = strings.Join(nt.profiles, " ") // one per node process
		}
	}
	deadline := time.Now().Add(cfg.Timeout)
	type submitDone struct {
		failed int
		err    error
	}
	subDone := make(chan submitDone, 1)
	sctx, cancelSubmit := context.WithCancel(ctx)
	defer cancelSubmit()
	measureStart := time.Now()
	held := false
	go func() {
		failed, err := sub.run(sctx, cfg.Jobs, cfg.Rate, deadline)
		subDone <- submitDone{failed, err}
	}()

	label := string(cfg.Target)
	bar := &progress{w: cfg.Progress, n: cfg.Jobs}
	var (
		ok, other int64
		submitted bool
		subRes    submitDone
		timedOut  bool
		pollErr   error
	)
	for {
		if !submitted {
			select {
			case subRes = <-subDone:
				submitted = true
			default:
			}
		}
		var err error
		ok, other, err = cnt.poll(ctx, false)
		if err != nil {
			pollErr = err
		}
		bar.update(label, r.tr.submitted.Load(), r.tr.received.Load(), ok+other, false)
		if ok+other >= int64(cfg.Jobs) {
			break
		}
		if cfg.Hold && !held && r.tr.received.Load() >= int64(cfg.Jobs) {
			held = true
			phase := time.Now()
			r.holdPhase(ctx, measureStart)
			// The hold (and an adoption) is not part of the run's time budget.
			deadline = deadline.Add(time.Since(phase))
		}
		if submitted && subRes.err != nil && r.tr.answered.Load() >= r.tr.submitted.Load() && ok+other >= r.tr.submitted.Load() {
			break // every job that could be submitted is done
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			timedOut = true
			break
		}
		wait := pollSlow
		if r.tr.answered.Load() >= int64(cfg.Jobs) {
			wait = pollFast
		}
		sleepCtx(ctx, wait)
	}
	if !timedOut {
		r.settleCompleted(ctx, before.node, ok+other)
	}
	after := r.snapshot(ctx, natsPID)
	if r.res.Hold != nil && !r.res.Hold.releasedAt.IsZero() {
		r.res.Hold.ReleaseToDoneSec = round3(time.Since(r.res.Hold.releasedAt).Seconds())
	}
	if cfg.CPUProfile != "" {
		if err := r.tgt.stopProfile(); err != nil {
			res.Notes = append(res.Notes, "cpu profile: "+err.Error())
		}
	}
	bar.update(label, r.tr.submitted.Load(), r.tr.received.Load(), ok+other, true)
	bar.finish()
	cancelSubmit()
	if !submitted {
		subRes = <-subDone
	}
	// Keep listening a moment for late duplicates.
	sleepCtx(ctx, cfg.Settle)

	rctx, cancel := context.WithTimeout(context.Background(), readTimeout+time.Duration(cfg.Jobs/10_000)*time.Second)
	defer cancel()
	ids := make([]string, cfg.Jobs)
	for i := range ids {
		ids[i] = r.tr.id(i)
	}
	recs, err := readRecords(rctx, r.rdb, r.st.Keys(), ids)
	if err != nil {
		return res, err
	}
	r.compute(recs, before, after)
	res.Jobs.SubmitFailed = subRes.failed
	if subRes.err != nil && !errors.Is(subRes.err, context.Canceled) {
		res.Failures = append(res.Failures, "submit: "+subRes.err.Error())
	}
	switch {
	case timedOut && ctx.Err() != nil:
		res.Failures = append(res.Failures, fmt.Sprintf("interrupted with %d of %d jobs not terminal",
			res.Jobs.NotTerminal, cfg.Jobs))
	case timedOut:
		res.Failures = append(res.Failures, fmt.Sprintf("timed out after %s with %d of %d jobs not terminal",
			cfg.Timeout, res.Jobs.NotTerminal, cfg.Jobs))
	}
	if pollErr != nil {
		res.Notes = append(res.Notes, "a completion poll failed: "+pollErr.Error())
	}
	if res.Jobs.NotTerminal > 0 && !timedOut {
		res.Failures = append(res.Failures, fmt.Sprintf("%d jobs not terminal", res.Jobs.NotTerminal))
	}
	if res.Jobs.NotSucceeded > 0 {
		res.Failures = append(res.Failures, fmt.Sprintf("%d jobs terminal but not SUCCEEDED: %v",
			res.Jobs.NotSucceeded, res.Jobs.FinalStates))
	}
	if res.Jobs.Duplicates > 0 {
		res.Failures = append(res.Failures, fmt.Sprintf("%d jobs received more than once", res.Jobs.Duplicates))
	}
	if n := r.fl.pubErrs.Load(); n > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("simulated workers failed to publish %d results", n))
	}
	if n := r.tr.foreign.Load(); n > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("workers received %d requests for jobs that are not this run's", n))
	}
	if bad := r.tr.badPackets.Load(); bad > 0 {
		res.Failures = append(res.Failures, fmt.Sprintf("workers received %d packets that are not job requests", bad))
	}
	res.Env.LoadEnd = loadAverage()
	res.OK = len(res.Failures) == 0
	if !res.OK {
		return res, fmt.Errorf("%w: %s", ErrRunFailed, strings.Join(res.Failures, "; "))
	}
	return res, nil
}

// compute fills the result's figures from the records and the two snapshots.
func (r *runner) compute(recs []record, before, after snapshot) {
	res, tr, n := r.res, r.tr, r.cfg.Jobs
	res.Jobs.FinalStates = map[string]int{}
	res.Jobs.Submitted = int(tr.submitted.Load())
	res.Jobs.Received = int(tr.received.Load())
	res.Jobs.Answered = int(tr.answered.Load())
	res.Jobs.Duplicates, res.Jobs.NeverReceived = tr.duplicates()
	res.PerWorker = r.fl.perWorker()
	res.MaxHeld, res.Overfills = r.fl.capacity()
	if c := r.cfg; c.ConcurrencyKeys > 0 {
		res.Keys = &KeysResult{Keys: c.ConcurrencyKeys, Limit: c.KeyLimit, IdealMakespanSec: c.IdealMakespan().Seconds()}
		res.Keys.MaxHeld, res.Keys.Overfills = r.fl.keyCapacity()
		k := res.Keys
		k.Gaps, k.GapMeanMs, k.GapP50Ms, k.GapP90Ms, k.GapP99Ms, k.GapMaxMs = r.fl.keyGapStats()
		k.LateGaps, k.LateGapMeanMs = r.fl.keyLateGaps()
	}

	var firstSubmit int64 = math.MaxInt64
	for i := 0; i < n; i++ {
		if s := tr.submitNs[i].Load(); s > 0 && s < firstSubmit {
			firstSubmit = s
		}
	}
	if firstSubmit == math.MaxInt64 {
		firstSubmit = 0
	}
	firstWallMs := float64(tr.wallNs(firstSubmit)) / 1e6
	var lastTerminalMs int64
	dispatch := make([]float64, 0, n)
	s2t := make([]float64, 0, n)
	var toRecord, toDispatched, answerToTerm []float64
	for i, rec := range recs {
		st := string(rec.state)
		if st == "" {
			st = "MISSING"
		}
		res.Jobs.FinalStates[st]++
		switch {
		case rec.state == jobstate.StateSucceeded:
			res.Jobs.Terminal++
			res.Jobs.Succeeded++
		case rec.state.Terminal():
			res.Jobs.Terminal++
			res.Jobs.NotSucceeded++
		default:
			res.Jobs.NotTerminal++
		}
		sub := tr.submitNs[i].Load()
		if sub == 0 {
			continue
		}
		subWallMs := float64(tr.wallNs(sub)) / 1e6
		if rc := tr.receiptNs[i].Load(); rc > 0 {
			dispatch = append(dispatch, math.Max(0, float64(rc-sub)/1e6))
		}
		if rec.terminalMs > 0 {
			lastTerminalMs = max(lastTerminalMs, rec.terminalMs)
			s2t = append(s2t, math.Max(0, float64(rec.terminalMs)-subWallMs))
			if a := tr.answerNs[i].Load(); a > 0 {
				answerToTerm = append(answerToTerm, math.Max(0, float64(rec.terminalMs)-float64(tr.wallNs(a))/1e6))
			}
		}
		if rec.createdMs > 0 {
			toRecord = append(toRecord, math.Max(0, float64(rec.createdMs)-subWallMs))
			if rec.dispatchedMs > 0 {
				toDispatched = append(toDispatched, float64(rec.dispatchedMs-rec.createdMs))
			}
		}
	}
	res.DispatchMs = summarize(dispatch)
	res.SubmitToTerminalMs = summarize(s2t)
	res.Stages = Stages{SubmitToRecordMs: summarize(toRecord), RecordToDispatchedMs: summarize(toDispatched),
		AnswerToTerminalMs: summarize(answerToTerm)}
	upper := math.Max(res.SubmitToTerminalMs.P999, res.DispatchMs.P999) * 1.1
	res.DispatchHist = histogram(dispatch, upper)
	res.TerminalHist = histogram(s2t, upper)

	if lastTerminalMs > 0 {
		durMs := float64(lastTerminalMs) - firstWallMs
		// A run shorter than the 1 ms timestamp resolution is reported as
		// 1 ms rather than divided by zero.
		durMs = math.Max(durMs, 1)
		res.DurationSec = round3(durMs / 1000)
		if k := res.Keys; k != nil && k.IdealMakespanSec > 0 {
			k.OverIdealPct = math.Round(1000*(res.DurationSec-k.IdealMakespanSec)/k.IdealMakespanSec) / 10
		}
		if res.Jobs.NotTerminal == 0 {
			res.JobsPerSec = math.Round(float64(res.Jobs.Terminal) / (durMs / 1000))
		}
		res.Timeline = newTimeline(durMs)
		for i, rec := range recs {
			if s := tr.submitNs[i].Load(); s > 0 {
				res.Timeline.add(res.Timeline.Submitted, float64(tr.wallNs(s))/1e6-firstWallMs)
			}
			if rec.terminalMs > 0 {
				res.Timeline.add(res.Timeline.Terminal, float64(rec.terminalMs)-firstWallMs)
			}
		}
	}
	r.costs(before, after)
}

// costs turns the two snapshots into per-job figures.
func (r *runner) costs(before, after snapshot) {
	res, n := r.res, float64(r.cfg.Jobs)
	// CPU-seconds per 1,000 jobs, to 0.1 CPU-ms.
	per1k := func(d time.Duration) float64 { return math.Round(d.Seconds()/n*1000*1e4) / 1e4 }
	perJob := func(v float64) float64 { return math.Round(v/n*1000) / 1000 }

	res.Node.Scope = r.tgt.scope()
	res.Node.PID = r.tgt.pid()
	if before.nodeErrs != nil || after.nodeErrs != nil {
		res.Notes = append(res.Notes, fmt.Sprintf("node counters unreadable: %v", errors.Join(before.nodeErrs, after.nodeErrs)))
	}
	has := after.has
	if has.CPU {
		cpu := after.node.CPU - before.node.CPU
		res.Node.Measured = true
		res.Node.CPUSec = round3(cpu.Seconds())
		res.Node.CPUSecPer1k = per1k(cpu)
	}
	if has.RSS {
		res.Node.PeakRSSBytes = after.node.PeakRSS
	}
	if has.Mem {
		res.Node.MemMeasured = true
		res.Node.GCs = after.node.GCs - before.node.GCs
		res.Node.AllocBytesPerJob = math.Round(float64(after.node.AllocBytes-before.node.AllocBytes) / n)
		res.Node.MallocsPerJob = math.Round(float64(after.node.Mallocs-before.node.Mallocs) / n)
	}
	res.CapacityWaitsPerJob = capacityWaitsPerJob(before.node.CapacityWaits, after.node.CapacityWaits, n)
	r.nodeCosts(before, after)
	if r.cfg.Node == NodeExternal && !has.CPU {
		res.Notes = append(res.Notes, "node CPU and RSS not measured: pass --node-pid for an external node")
	}

	harness := after.harness.sub(before.harness)
	if has.Redis {
		d := after.node.Redis.sub(before.node.Redis)
		res.Redis.ClientMeasured = true
		res.Redis.ClientCommandsPerJob = perJob(float64(d.Commands))
		res.Redis.RoundTripsPerJob = perJob(float64(d.RoundTrips))
		res.Redis.ClientByName = map[string]float64{}
		for k, v := range d.ByName {
			res.Redis.ClientByName[k] = perJob(float64(v))
		}
	}
	if before.server.ok && after.server.ok {
		calls, _ := callsDelta(before.server, after.server)
		// INFO's own calls are excluded on both sides: the server counts the
		// first INFO in the second reading but not the second one.
		delete(calls, "info")
		var total int64
		res.Redis.ServerByName = map[string]float64{}
		for k, v := range calls {
			v -= harness.ByName[k]
			if v <= 0 {
				continue
			}
			total += v
			res.Redis.ServerByName[k] = perJob(float64(v))
		}
		res.Redis.ServerMeasured = true
		res.Redis.ServerCommandsPerJob = perJob(float64(total))
		res.Redis.ServerCPUSecPer1k = per1k(time.Duration((after.server.cpuSec - before.server.cpuSec) * float64(time.Second)))
		if has.Redis {
			// Every EVALSHA the server ran should be one the node sent; more
			// means another client shared the server during the run.
			node := after.node.Redis.sub(before.node.Redis)
			if extra := calls["evalsha"] - node.ByName["evalsha"]; extra > 0 {
				res.Notes = append(res.Notes, fmt.Sprintf("Redis ran %d EVALSHA calls the node did not send: "+
					"another client used the server during the run, and the server-side command and CPU "+
					"figures include its work", extra))
			}
		}
		r.redisMasters(before, after)
	} else {
		res.Notes = append(res.Notes, "Redis INFO commandstats unavailable (embedded store?): server-side command counts not measured")
	}

	if has.NATS {
		res.NATS.NodeMeasured = true
		res.NATS.NodeInPerJob = perJob(float64(after.node.NATSIn - before.node.NATSIn))
		res.NATS.NodeOutPerJob = perJob(float64(after.node.NATSOut - before.node.NATSOut))
	}
	res.NATS.BenchInPerJob = perJob(float64(after.wIn - before.wIn + after.sIn - before.sIn))
	res.NATS.BenchOutPerJob = perJob(float64(after.wOut - before.wOut + after.sOut - before.sOut))
	res.NATS.TotalPerJob = round3(res.NATS.NodeInPerJob + res.NATS.NodeOutPerJob + res.NATS.BenchInPerJob + res.NATS.BenchOutPerJob)
	if before.natsOK && after.natsOK {
		res.NATS.ServerCPUSecPer1k = per1k(after.natsCPU - before.natsCPU)
	}
	res.Harness.CPUSecPer1k = per1k(after.selfCPU - before.selfCPU)
	r.systemCeiling()
	if r.cfg.Node == NodeInProcess {
		res.Notes = append(res.Notes, "in-process node: node CPU and RSS include the harness (workers, submitter, polls)")
	}
}

// capacityWaitsPerJob is the node's capacity waits between two readings per
// job (nil when either reading has none). A counter that went down belongs
// to a new process (an adoption's second node), which counted from zero
// within the run: its reading is the whole of it.
func capacityWaitsPerJob(before, after *float64, jobs float64) *float64 {
	if before == nil || after == nil {
		return nil
	}
	d := *after - *before
	if d < 0 {
		d = *after
	}
	v := math.Round(d/jobs*1000) / 1000
	return &v
}

// teardown stops everything the run started and deletes its data.
func (r *runner) teardown() {
	if r.fl != nil {
		r.fl.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout+time.Duration(r.cfg.Jobs/5_000)*time.Second)
	defer cancel()
	if r.tgt != nil {
		if err := r.tgt.stop(ctx); err != nil {
			r.log.Warn("stopping the node", "err", err)
		}
	}
	if !r.cfg.Keep && r.rdb != nil && r.sconn != nil {
		if err := r.cleanup(ctx); err != nil {
			r.log.Warn("cleanup incomplete", "run", r.cfg.RunID, "err", err)
		}
	}
	if r.sconn != nil {
		r.sconn.Close()
	}
	if r.wconn != nil {
		r.wconn.Close()
	}
	if r.rdb != nil {
		_ = r.rdb.Close()
	}
}

// cleanup deletes the run's streams and keys. An external node owns its
// streams and may hold other runs' jobs under the same prefixes, so there only
// this run's job keys are deleted.
func (r *runner) cleanup(ctx context.Context) error {
	if r.cfg.Node == NodeExternal {
		return r.deleteJobs(ctx)
	}
	var errs []error
	if js, err := jetstream.New(r.sconn); err == nil {
		for _, k := range []bus.StreamKind{bus.StreamSubmit, bus.StreamResult, bus.StreamCancel} {
			if err := js.DeleteStream(ctx, bus.StreamName(r.pfx.Stream, k)); err != nil &&
				!errors.Is(err, jetstream.ErrStreamNotFound) {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, r.deleteMatching(ctx, r.pfx.Key+"*"))
	return errors.Join(errs...)
}

// deleteMatching deletes every key matching pattern: scanned on each master
// of a cluster (a SCAN sees one server's keys), deleted one key per command
// in pipelines (a cluster refuses a DEL whose keys span slots).
func (r *runner) deleteMatching(ctx context.Context, pattern string) error {
	scanOne := func(ctx context.Context, c redis.UniversalClient) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		var keys []string
		flush := func() error {
			if len(keys) == 0 {
				return nil
			}
			pipe := r.rdb.Pipeline()
			for _, k := range keys {
				pipe.Del(ctx, k)
			}
			_, err := pipe.Exec(ctx)
			keys = keys[:0]
			return err
		}
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
			if len(keys) == 1000 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		return errors.Join(iter.Err(), flush())
	}
	if cc, ok := r.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scanOne(ctx, c) })
	}
	return scanOne(ctx, r.rdb)
}

// deleteJobs removes this run's jobs (records, histories, locks, index
// entries) and nothing else.
func (r *runner) deleteJobs(ctx context.Context) error {
	keys := r.st.Keys()
	ids := make([]string, 0, r.cfg.Jobs+r.cfg.Warmup)
	for i := 0; i < r.cfg.Jobs; i++ {
		ids = append(ids, r.cfg.RunID+"-"+strconv.Itoa(i))
	}
	for i := 0; i < r.cfg.Warmup; i++ {
		ids = append(ids, r.cfg.RunID+"w-"+strconv.Itoa(i))
	}
	for chunk := range slices.Chunk(ids, recordBatch) {
		pipe := r.rdb.Pipeline()
		for _, id := range chunk {
			pipe.Del(ctx, keys.Job(id), keys.Lock(id))
			for _, s := range jobstate.AllStates {
				pipe.ZRem(ctx, keys.Index(store.Shard(id), string(s)), id)
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}

func durMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
