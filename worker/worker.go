// Package worker is a small CAP worker: it heartbeats, takes JobRequests from
// its pool subject (queue group = subject, as CAP SDK workers do) and,
// optionally, from its direct subject worker.<id>.jobs, runs a handler, and
// publishes the JobResult on sys.job.result as a request, retried until the
// result stream acknowledges it; optionally it runs each job id once however
// often it is delivered. It is what `troupe worker`, `troupe dev` and the
// tests run.
//
// Handlers: Echo and Sleep; Fail, and Demo, which fails a job whose env
// asks it to (demo.go); Typed, a function with typed arguments whose input
// and result are JSON kept where CAP's Redis convention puts them
// (typed.go, package jobdata).
package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/tracing"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/signing"
)

// HeartbeatDefault is the CAP SDKs' heartbeat interval (the node's
// registry.SDKHeartbeat, kept equal by a test).
const HeartbeatDefault = 5 * time.Second

// Handler runs one job and returns its result (job_id and worker_id are
// filled in by the worker).
type Handler func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult

// Echo succeeds at once, with the job's context pointer as its result.
func Echo(_ context.Context, req *capv1.JobRequest) *capv1.JobResult {
	return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: req.ContextPtr}
}

// Sleep succeeds after d (or fails if ctx ends first).
func Sleep(d time.Duration) Handler {
	return func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: req.ContextPtr}
		case <-ctx.Done():
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_CANCELLED, ErrorMessage: ctx.Err().Error()}
		}
	}
}

// Config configures a worker.
type Config struct {
	ID   string
	Pool string
	// Topics are the pool subjects (job topics) to queue-subscribe to.
	Topics []string
	// Direct also subscribes to worker.<id>.jobs and says so in the
	// heartbeat (label troupe.dispatch=direct). A stock CAP SDK worker does not.
	Direct bool
	// SubjectPrefix is put before every CAP subject, as the node's
	// Config.SubjectPrefix ("" = the standard names).
	SubjectPrefix string
	Handler       Handler
	Heartbeat     time.Duration
	MaxParallel   int32
	Labels        map[string]string
	// Progress sends a RUNNING JobProgress before running the handler.
	Progress bool
	// OnReceive, if set, sees every request as it arrives (tests count
	// receipts with it); with Dedupe, only the first delivery of each job.
	OnReceive func(subject string, req *capv1.JobRequest)

	// Dedupe runs each job id at most once, however often it is delivered
	// (of the last DedupeKeep job ids), and says so in the heartbeat
	// (registry.LabelDedupe), which lets the node repeat a direct dispatch
	// that may have been lost. A repeat of a job still running is answered
	// with a RUNNING JobProgress; a repeat of a finished one with its result
	// again, if it is among the last ResultKeep results (the node repeats a
	// dispatch after it, or its result stream, lost a result), else
	// dropped. OnDuplicate sees each repeat.
	Dedupe      bool
	DedupeKeep  int
	ResultKeep  int
	OnDuplicate func(subject string, req *capv1.JobRequest)

	// Signer, when set, signs every packet the worker sends (heartbeats,
	// progress, results) under sender id ID.
	Signer *signing.Signer
	// Verifier, when set, checks the signature of every dispatch before the
	// worker runs it; a rejected one is dropped (the node times the job out
	// as if the worker never got it), counted in Rejected and passed to
	// OnReject.
	Verifier *signing.Verifier
	OnReject func(subject string, err error)

	// OnStale sees each dispatch dropped because it reached the worker
	// after a silence its node could have evicted it for (StaleDispatch).
	OnStale func(subject string, req *capv1.JobRequest)
}

// Worker is a running CAP worker.
type Worker struct {
	cfg    Config
	subj   bus.Subjects
	nc     *nats.Conn
	subs   []*nats.Subscription
	active atomic.Int32
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}
	enc    bus.Encoder

	rejected atomic.Uint64

	// beats: this worker's recent heartbeat send times; stale: dispatches
	// dropped as stale (stale.go).
	beats beatLog
	stale atomic.Uint64

	// running: job id → the cancel of its handler's context, so a JobCancel
	// on sys.job.cancel stops the job here.
	runMu   sync.Mutex
	running map[string]context.CancelCauseFunc

	// Dedupe: job id → running; order is the FIFO that bounds it.
	seenMu sync.Mutex
	seen   map[string]bool
	order  []string
	next   int
	// Dedupe: the encoded results of the last ResultKeep finished jobs
	// (resOrder bounds them), and the jobs whose result is being sent again.
	results   map[string][]byte
	resOrder  []string
	resNext   int
	resending map[string]bool
}

// dedupeKeepDefault is how many job ids a deduping worker remembers;
// resultKeepDefault how many results it keeps to send again.
const (
	dedupeKeepDefault = 100_000
	resultKeepDefault = 10_000
)

// Start subscribes and starts heartbeating.
func Start(nc *nats.Conn, cfg Config) (*Worker, error) {
	if cfg.ID == "" || cfg.Pool == "" || len(cfg.Topics) == 0 {
		return nil, fmt.Errorf("worker: ID, Pool and Topics are required")
	}
	if cfg.Handler == nil {
		cfg.Handler = Echo
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = HeartbeatDefault
	}
	if cfg.MaxParallel <= 0 {
		cfg.MaxParallel = 64
	}
	labels := map[string]string{}
	for k, v := range cfg.Labels {
		labels[k] = v
	}
	if cfg.Direct {
		labels[registry.LabelDispatch] = registry.DispatchDirect
	}
	if cfg.Progress {
		labels[registry.LabelProgress] = registry.ProgressStarted
	}
	if cfg.Dedupe {
		labels[registry.LabelDedupe] = registry.DedupeJobID
		if cfg.DedupeKeep <= 0 {
			cfg.DedupeKeep = dedupeKeepDefault
		}
		if cfg.ResultKeep <= 0 {
			cfg.ResultKeep = resultKeepDefault
		}
	}
	cfg.Labels = labels
	ctx, cancel := context.WithCancel(context.Background())
	w := &Worker{cfg: cfg, subj: bus.NewSubjects(cfg.SubjectPrefix), nc: nc, ctx: ctx, cancel: cancel, sem: make(chan struct{}, cfg.MaxParallel),
		running: map[string]context.CancelCauseFunc{}}
	if cfg.Dedupe {
		w.seen = make(map[string]bool)
		w.order = make([]string, cfg.DedupeKeep)
		w.results, w.resending = make(map[string][]byte), make(map[string]bool)
		w.resOrder = make([]string, cfg.ResultKeep)
	}
	if cfg.Signer != nil {
		w.enc.Signer = cfg.Signer
	}
	for _, t := range cfg.Topics {
		subj := w.subj.Pool(t)
		s, err := nc.QueueSubscribe(subj, subj, w.onMsg)
		if err != nil {
			w.Stop()
			return nil, fmt.Errorf("worker: subscribe %s: %w", subj, err)
		}
		w.subs = append(w.subs, s)
	}
	if cfg.Direct {
		s, err := nc.Subscribe(w.subj.Worker(cfg.ID), w.onMsg)
		if err != nil {
			w.Stop()
			return nil, fmt.Errorf("worker: subscribe direct: %w", err)
		}
		w.subs = append(w.subs, s)
	}
	// Cancels: CAP publishes them on sys.job.cancel, for every worker to
	// hear; the one running the job stops it.
	cs, err := nc.Subscribe(w.subj.Cancel, w.onCancel)
	if err != nil {
		w.Stop()
		return nil, fmt.Errorf("worker: subscribe cancel: %w", err)
	}
	w.subs = append(w.subs, cs)
	if err := nc.Flush(); err != nil {
		w.Stop()
		return nil, err
	}
	w.beat()
	w.wg.Add(1)
	go w.heartbeats()
	return w, nil
}

func (w *Worker) beat() {
	// Taken before the packet's created_at, so never after it; a beat sent
	// while disconnected is not heard when sent, so it does not count.
	at := time.Now()
	connected := w.nc.IsConnected()
	data, err := w.enc.Heartbeat(w.cfg.ID, &capv1.Heartbeat{
		WorkerId: w.cfg.ID, Pool: w.cfg.Pool, Type: "troupe-demo", ActiveJobs: w.active.Load(),
		MaxParallelJobs: w.cfg.MaxParallel, Labels: w.cfg.Labels,
		Capabilities: w.cfg.Topics,
	})
	if err == nil && w.nc.Publish(w.subj.Heartbeat, data) == nil && connected {
		w.beats.sent(at)
	}
}

func (w *Worker) heartbeats() {
	defer w.wg.Done()
	t := time.NewTicker(w.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-t.C:
			w.beat()
		}
	}
}

func (w *Worker) onMsg(m *nats.Msg) {
	pkt, err := bus.Decode(m.Data)
	if err != nil || pkt.GetJobRequest() == nil {
		return
	}
	if !w.verified(pkt, m, signing.RoleNode) {
		return
	}
	req := pkt.GetJobRequest()
	if w.cfg.Dedupe && !w.firstDelivery(req.JobId) {
		w.duplicate(m.Subject, pkt.TraceId, req)
		return
	}
	if w.dropStale(m.Subject, req) {
		if w.cfg.Dedupe {
			w.forget(req.JobId) // never run: a fresh repeat may run it
		}
		return
	}
	if w.cfg.OnReceive != nil {
		w.cfg.OnReceive(m.Subject, req)
	}
	select {
	case w.sem <- struct{}{}:
	case <-w.ctx.Done():
		if w.cfg.Dedupe {
			w.forget(req.JobId) // never run: a later delivery may run it
		}
		return
	}
	w.active.Add(1)
	w.wg.Add(1)
	go func() {
		defer func() {
			if w.cfg.Dedupe {
				w.markDone(req.JobId)
			}
			w.active.Add(-1)
			<-w.sem
			w.wg.Done()
		}()
		w.run(pkt.TraceId, req)
	}()
}

// verified reports whether pkt's signature verifies and its sender has one
// of roles (always, with no Verifier); a packet that does not is counted
// and reported. Dispatches are taken from nodes only: a dispatch signed by
// any other key (a worker's, a client's) would run a job that never passed
// the node's policy.
func (w *Worker) verified(pkt *capv1.BusPacket, m *nats.Msg, roles ...signing.Role) bool {
	if w.cfg.Verifier == nil {
		return true
	}
	p, err := w.cfg.Verifier.VerifyPrincipal(pkt, m.Data)
	if err == nil && !p.Is(roles...) {
		err = &RoleError{Sender: p.String(), Kind: payloadName(pkt)}
	}
	if err != nil {
		w.rejected.Add(1)
		if w.cfg.OnReject != nil {
			w.cfg.OnReject(m.Subject, err)
		}
		return false
	}
	return true
}

// RoleError is a verified packet whose sender's role may not send it to a
// worker (OnReject's error).
type RoleError struct{ Sender, Kind string }

func (e *RoleError) Error() string {
	return "worker: a " + e.Kind + " from " + e.Sender + " is not taken (role not allowed)"
}

func payloadName(pkt *capv1.BusPacket) string {
	if pkt.GetJobCancel() != nil {
		return "cancel"
	}
	return "dispatch"
}

// firstDelivery records jobID as running and reports whether it is new.
func (w *Worker) firstDelivery(jobID string) bool {
	w.seenMu.Lock()
	defer w.seenMu.Unlock()
	if _, ok := w.seen[jobID]; ok {
		return false
	}
	if old := w.order[w.next]; old != "" {
		delete(w.seen, old)
	}
	w.order[w.next] = jobID
	w.next = (w.next + 1) % len(w.order)
	w.seen[jobID] = true
	return true
}

func (w *Worker) forget(jobID string) {
	w.seenMu.Lock()
	delete(w.seen, jobID) // its slot in order is reclaimed when reached
	w.seenMu.Unlock()
}

func (w *Worker) markDone(jobID string) {
	w.seenMu.Lock()
	if _, ok := w.seen[jobID]; ok {
		w.seen[jobID] = false
	}
	w.seenMu.Unlock()
}

// duplicate handles a repeated delivery: a job still running is confirmed
// with a progress, so the node stops repeating it; a finished one's kept
// result is sent again (once at a time per job).
func (w *Worker) duplicate(subject, trace string, req *capv1.JobRequest) {
	w.seenMu.Lock()
	running := w.seen[req.JobId]
	result := w.results[req.JobId]
	again := !running && result != nil && !w.resending[req.JobId]
	if again {
		w.resending[req.JobId] = true
	}
	w.seenMu.Unlock()
	if w.cfg.OnDuplicate != nil {
		w.cfg.OnDuplicate(subject, req)
	}
	switch {
	case running:
		w.progress(trace, req.JobId, "already running")
	case again:
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.publishResult(req.JobId, result)
			w.seenMu.Lock()
			delete(w.resending, req.JobId)
			w.seenMu.Unlock()
		}()
	}
}

// keepResult keeps a finished job's encoded result to send again, and
// marks the job finished and its result being sent (by run, which calls
// sent when it is done).
func (w *Worker) keepResult(jobID string, data []byte) {
	w.seenMu.Lock()
	defer w.seenMu.Unlock()
	if _, ok := w.seen[jobID]; ok {
		w.seen[jobID] = false
	}
	w.resending[jobID] = true
	if old := w.resOrder[w.resNext]; old != "" {
		delete(w.results, old)
	}
	w.resOrder[w.resNext] = jobID
	w.resNext = (w.resNext + 1) % len(w.resOrder)
	w.results[jobID] = data
}

func (w *Worker) progress(trace, jobID, msg string) {
	if data, err := w.enc.Progress(trace, w.cfg.ID, &capv1.JobProgress{JobId: jobID,
		Status: capv1.JobStatus_JOB_STATUS_RUNNING, Message: msg}); err == nil {
		_ = w.nc.Publish(w.subj.Progress, data)
	}
}

// onCancel stops the job a JobCancel names, if it runs here: its handler's
// context is cancelled and its answer is not sent — whoever cancelled has
// decided the job's outcome already (an operator, the node's timeout, a
// result of an earlier dispatch), and an answer racing the cancel to the
// node would be recorded instead of it. With a Verifier, only a cancel
// whose signature verifies counts.
func (w *Worker) onCancel(m *nats.Msg) {
	pkt, err := bus.Decode(m.Data)
	if err != nil || pkt.GetJobCancel() == nil {
		return
	}
	if !w.verified(pkt, m, signing.RoleNode, signing.RoleOperator, signing.RoleClient) {
		return
	}
	w.runMu.Lock()
	stop := w.running[pkt.GetJobCancel().GetJobId()]
	w.runMu.Unlock()
	if stop != nil {
		stop(errCancelled)
	}
}

// errCancelled is the cause of a job's context when a JobCancel stopped it.
var errCancelled = errors.New("worker: job cancelled (sys.job.cancel)")

func (w *Worker) run(trace string, req *capv1.JobRequest) {
	if w.cfg.Progress {
		w.progress(trace, req.JobId, "started")
	}
	ctx, stop := context.WithCancelCause(w.ctx)
	w.runMu.Lock()
	w.running[req.JobId] = stop
	w.runMu.Unlock()
	defer func() {
		w.runMu.Lock()
		delete(w.running, req.JobId)
		w.runMu.Unlock()
		stop(nil)
	}()
	start := time.Now()
	// The span Troupe named in the request's traceparent (the job's
	// DISPATCHED span) is the remote parent in ctx: a handler that starts
	// OpenTelemetry spans from ctx continues the job's trace.
	res := w.cfg.Handler(tracing.ContextFromRequest(ctx, req), req)
	if errors.Is(context.Cause(ctx), errCancelled) {
		return // stopped by its cancel: no answer (see onCancel)
	}
	res.JobId, res.WorkerId = req.JobId, w.cfg.ID
	if res.ExecutionMs == 0 {
		res.ExecutionMs = time.Since(start).Milliseconds()
	}
	data, err := w.enc.Result(trace, w.cfg.ID, res)
	if err == nil {
		if w.cfg.Dedupe {
			w.keepResult(req.JobId, data)
		}
		w.publishResult(req.JobId, data)
		if w.cfg.Dedupe {
			w.seenMu.Lock()
			delete(w.resending, req.JobId)
			w.seenMu.Unlock()
		}
	}
}

// Result delivery: a core publish can vanish if the NATS server goes away
// at that moment, and the job would then wait for its running deadline. The
// result subject is a JetStream stream's, so a request gets the stream's
// PubAck back; the worker retries until it has one (a duplicate result is
// absorbed by the scheduler), for at most resultRetryFor. A result stream at
// its cap (bus.StreamMaxMsgs) refuses the publish (DiscardNew) until the
// nodes drain it — at a node's intake rate that can take minutes after a
// release of hundreds of thousands of jobs — so the bound is long.
const (
	resultAckWait  = 2 * time.Second
	resultRetryFor = 10 * time.Minute
)

func (w *Worker) publishResult(jobID string, data []byte) {
	deadline := time.Now().Add(resultRetryFor)
	backoff := 100 * time.Millisecond
	for {
		reply, err := w.nc.Request(w.subj.Result, data, resultAckWait)
		if err == nil && !bytes.Contains(reply.Data, []byte(`"error"`)) {
			return
		}
		if time.Now().After(deadline) {
			slog.Warn("worker: result not acknowledged; giving up", "worker_id", w.cfg.ID, "job_id", jobID, "err", err)
			return
		}
		select {
		case <-time.After(backoff):
		case <-w.ctx.Done():
			// Stopping: one last plain publish rather than nothing.
			_ = w.nc.Publish(w.subj.Result, data)
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// Rejected counts the dispatches dropped because their signature did not
// verify.
func (w *Worker) Rejected() uint64 { return w.rejected.Load() }

// Stop unsubscribes, stops heartbeating and waits for running jobs.
func (w *Worker) Stop() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
	w.cancel()
	w.wg.Wait()
}

// Name returns a default worker id for index i of a pool.
func Name(pool string, i int) string { return pool + "-w" + strconv.Itoa(i) }
