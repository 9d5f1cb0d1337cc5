package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/core"
)

// Writer is the store's group-commit stage. Job actors never wait on Redis:
// they hand an Op to the Writer and get the outcome back through Op.Done (which
// the node turns into a message to the actor). The Writer's goroutines each
// take whatever ops are queued — up to MaxBatch — and send them to Redis as
// one pipeline, so thousands of jobs' transitions cost a handful of round
// trips. Ops from one actor are never reordered because an actor has at most
// one op outstanding.
type Writer struct {
	s        *Store
	ops      chan *Op
	maxBatch int
	timeout  time.Duration

	wg     sync.WaitGroup
	stopMu sync.RWMutex // Submit holds it shared; Close exclusively
	closed bool
}

// Defaults for the Writer.
const (
	// WriterQueueDefault is the Writer's queue length; a full queue makes
	// Submit wait, which is the node's back-pressure on intake.
	WriterQueueDefault = 65536
	// WriterMaxBatchDefault caps ops per pipeline. Past ~256 a pipeline's
	// latency grows faster than its per-op cost falls.
	WriterMaxBatchDefault = 256
	// WriterConcurrencyDefault pipelines may be in flight at once, so one
	// batch's round trip overlaps the next batch's collection.
	WriterConcurrencyDefault = 4
	// WriterTimeoutDefault bounds one pipeline.
	WriterTimeoutDefault = 5 * time.Second
)

// OpKind says what an Op does.
type OpKind uint8

const (
	// OpActivate takes the job's lock and reads (or creates) its state.
	OpActivate OpKind = iota + 1
	// OpTransition runs Steps in order, each a fenced compare-and-set.
	OpTransition
	// OpRelease gives the lock up without a state change.
	OpRelease
	// OpDLQ appends DLQ to the DLQ stream.
	OpDLQ
	// OpClaim claims Op.IdemKey for the job (idempotency); Result.Holder
	// names the job that holds it.
	OpClaim
)

// Step is one fenced transition within an OpTransition.
type Step struct {
	// Expect lists the states the job may be in (comma-separated, see Expect).
	Expect string
	To     core.State
	Reason core.Reason
	// Fields are extra record fields to set, as name, value pairs.
	Fields []string
	// Terminal releases the lock, clears the due entry and starts the
	// retention clock.
	Terminal bool
	// Release gives the lock up after the step (the job passivates: it
	// waits for an outside event with no live actor).
	Release bool
	// Due sets the job's due time (unix ms) with the step; -1 clears it;
	// 0 leaves it as it is.
	Due int64
}

// Expect joins states for Step.Expect.
func Expect(states ...core.State) string {
	var b strings.Builder
	for i, st := range states {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(string(st))
	}
	return b.String()
}

// Op is one unit of work for the Writer.
type Op struct {
	Kind  OpKind
	JobID string
	Node  string
	// LockValue identifies the owner for OpTransition and OpRelease.
	LockValue string

	// OpActivate.
	Create  bool
	Topic   string
	Tenant  string
	TraceID string
	Request []byte

	// OpTransition.
	Steps []Step

	// OpClaim: the idempotency key and how long it is kept.
	IdemKey string
	IdemTTL time.Duration

	// OpDLQ (may accompany any kind; written in the same pipeline).
	DLQ *DLQEntry

	// Done receives the outcome on a Writer goroutine. It must not block.
	Done func(*Result)

	cmds []redis.Cmder
}

// ActivateStatus is the outcome of an activation.
type ActivateStatus string

const (
	ActivateCreated  ActivateStatus = "CREATED"
	ActivateAdopted  ActivateStatus = "ADOPTED"
	ActivateBusy     ActivateStatus = "BUSY"
	ActivateTerminal ActivateStatus = "TERMINAL"
	ActivateNotFound ActivateStatus = "NOTFOUND"
)

// StepStatus is the outcome of one Step.
type StepStatus string

const (
	StepOK       StepStatus = "OK"
	StepFenced   StepStatus = "FENCED"
	StepConflict StepStatus = "CONFLICT"
	StepNotFound StepStatus = "NOTFOUND"
)

// Result is an Op's outcome. Err is set when Redis could not be asked (the
// state is then unknown); the per-kind fields are meaningful only without Err.
type Result struct {
	Err error

	// OpActivate.
	Status ActivateStatus
	State  core.State
	Fence  int64
	// Holder is the lock value of the node that owns the job (BUSY), or for
	// OpClaim the job id that holds the idempotency key.
	Holder string
	// Fields is the job's record (ADOPTED only).
	Fields map[string]string

	// OpTransition: one entry per Step, in order.
	Steps []StepResult

	// OpRelease.
	Released bool
}

// StepResult is one Step's outcome; Before is the state the job was in.
type StepResult struct {
	Status StepStatus
	Before core.State
}

// OK reports whether every step applied.
func (r *Result) OK() bool {
	if r.Err != nil {
		return false
	}
	for _, s := range r.Steps {
		if s.Status != StepOK {
			return false
		}
	}
	return true
}

// NewWriter starts a Writer with concurrency goroutines.
func (s *Store) NewWriter(concurrency, maxBatch, queue int) *Writer {
	if concurrency <= 0 {
		concurrency = WriterConcurrencyDefault
	}
	if maxBatch <= 0 {
		maxBatch = WriterMaxBatchDefault
	}
	if queue <= 0 {
		queue = WriterQueueDefault
	}
	w := &Writer{s: s, ops: make(chan *Op, queue), maxBatch: maxBatch, timeout: WriterTimeoutDefault}
	for i := 0; i < concurrency; i++ {
		w.wg.Add(1)
		go w.loop()
	}
	return w
}

// ErrWriterClosed is the Result.Err of ops submitted after Close.
var ErrWriterClosed = errors.New("store: writer closed")

// Submit queues op. It waits while the queue is full.
func (w *Writer) Submit(op *Op) {
	w.stopMu.RLock()
	if w.closed {
		w.stopMu.RUnlock()
		op.Done(&Result{Err: ErrWriterClosed})
		return
	}
	// Sending under the read lock keeps Close from closing the channel
	// under a blocked sender; the writer goroutines keep draining meanwhile.
	w.ops <- op
	w.stopMu.RUnlock()
}

// Close stops accepting ops, finishes the queued ones and returns.
func (w *Writer) Close() {
	w.stopMu.Lock()
	if !w.closed {
		w.closed = true
		close(w.ops)
	}
	w.stopMu.Unlock()
	w.wg.Wait()
}

func (w *Writer) loop() {
	defer w.wg.Done()
	batch := make([]*Op, 0, w.maxBatch)
	for op := range w.ops {
		batch = append(batch[:0], op)
	fill:
		for len(batch) < w.maxBatch {
			select {
			case more, ok := <-w.ops:
				if !ok {
					break fill
				}
				batch = append(batch, more)
			default:
				break fill
			}
		}
		w.exec(batch)
	}
}

func (w *Writer) exec(batch []*Op) {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	results := make([]*Result, len(batch))
	pending := batch
	for attempt := 0; attempt < 2 && len(pending) > 0; attempt++ {
		pipe := w.s.rdb.Pipeline()
		for _, op := range pending {
			w.s.queue(ctx, pipe, op)
		}
		_, err := pipe.Exec(ctx)
		var retry []*Op
		for _, op := range pending {
			if noScript(op.cmds) && attempt == 0 {
				retry = append(retry, op)
				continue
			}
			results[indexOf(batch, op)] = w.s.decode(op, err)
		}
		if len(retry) > 0 {
			if lerr := w.s.LoadScripts(ctx); lerr != nil {
				for _, op := range retry {
					results[indexOf(batch, op)] = &Result{Err: lerr}
				}
				retry = nil
			}
		}
		pending = retry
	}
	for i, op := range batch {
		op.cmds = nil
		op.Done(results[i])
	}
}

func indexOf(batch []*Op, op *Op) int {
	for i, o := range batch {
		if o == op {
			return i
		}
	}
	panic("store: op not in batch")
}

func noScript(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if err := c.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			return true
		}
	}
	return false
}

// queue adds op's commands to pipe.
func (s *Store) queue(ctx context.Context, pipe redis.Pipeliner, op *Op) {
	op.cmds = op.cmds[:0]
	k := s.keys
	keys := []string{k.Job(op.JobID), k.History(op.JobID), k.Lock(op.JobID)}
	now := strconv.FormatInt(time.Now().UnixMilli(), 10)
	switch op.Kind {
	case OpActivate:
		create := "0"
		if op.Create {
			create = "1"
		}
		op.cmds = append(op.cmds, activateScript.EvalSha(ctx, pipe, keys,
			op.Node, now, s.cfg.LockTTL.Milliseconds(), create, k.Tag(op.JobID), op.JobID,
			op.Topic, op.Tenant, op.TraceID, op.Request, time.Now().Add(s.cfg.RescueAfter).UnixMilli()))
	case OpTransition:
		retention := int64(s.cfg.Retention / time.Second)
		if s.cfg.Retention < 0 {
			retention = 0
		}
		for _, st := range op.Steps {
			lock := "keep"
			switch {
			case st.Terminal:
				lock = "terminal"
			case st.Release:
				lock = "release"
			}
			args := make([]interface{}, 0, 11+len(st.Fields))
			args = append(args, op.LockValue, op.Node, st.Expect, string(st.To), now, string(st.Reason),
				k.Tag(op.JobID), op.JobID, lock, retention, st.Due)
			for _, f := range st.Fields {
				args = append(args, f)
			}
			op.cmds = append(op.cmds, transitionScript.EvalSha(ctx, pipe, keys, args...))
		}
	case OpRelease:
		op.cmds = append(op.cmds, releaseScript.EvalSha(ctx, pipe, keys[2:], op.LockValue))
	case OpClaim:
		ttl := int64(op.IdemTTL / time.Second)
		if ttl <= 0 {
			ttl = int64(RetentionDefault / time.Second)
		}
		op.cmds = append(op.cmds, claimScript.EvalSha(ctx, pipe, []string{op.IdemKey}, op.JobID, ttl))
	}
	if op.DLQ != nil {
		op.cmds = append(op.cmds, s.addDLQ(ctx, pipe, op.DLQ))
	}
}

// decode turns op's command replies into a Result.
func (s *Store) decode(op *Op, execErr error) *Result {
	r := &Result{}
	for _, c := range op.cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			r.Err = fmt.Errorf("store: %s %s: %w", c.Name(), op.JobID, err)
			return r
		}
	}
	if len(op.cmds) == 0 && execErr != nil {
		r.Err = execErr
		return r
	}
	switch op.Kind {
	case OpActivate:
		v, err := op.cmds[0].(*redis.Cmd).StringSlice()
		if err != nil || len(v) < 4 || len(v)%2 != 0 {
			r.Err = fmt.Errorf("store: activate %s: bad reply %v (%v)", op.JobID, v, err)
			return r
		}
		r.Status, r.State, r.Holder = ActivateStatus(v[0]), core.State(v[1]), v[3]
		r.Fence, _ = strconv.ParseInt(v[2], 10, 64)
		if len(v) > 4 {
			r.Fields = make(map[string]string, (len(v)-4)/2)
			for i := 4; i+1 < len(v); i += 2 {
				r.Fields[v[i]] = v[i+1]
			}
		}
	case OpTransition:
		r.Steps = make([]StepResult, len(op.Steps))
		for i := range op.Steps {
			v, err := op.cmds[i].(*redis.Cmd).StringSlice()
			if err != nil || len(v) != 2 {
				r.Err = fmt.Errorf("store: transition %s: bad reply %v (%v)", op.JobID, v, err)
				return r
			}
			r.Steps[i] = StepResult{Status: StepStatus(v[0]), Before: core.State(v[1])}
		}
	case OpRelease:
		n, _ := op.cmds[0].(*redis.Cmd).Int64()
		r.Released = n == 1
	case OpClaim:
		r.Holder, _ = op.cmds[0].(*redis.Cmd).Text()
	}
	return r
}
