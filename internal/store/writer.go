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

	"github.com/troupe-run/troupe/internal/jobstate"
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
	// OpActivate takes the job's lock and reads (or creates) its state; a
	// created job takes Op.T as its plan.
	OpActivate OpKind = iota + 1
	// OpTransition applies Op.T, a fenced compare-and-set.
	OpTransition
	// OpRelease gives the lock up without a state change.
	OpRelease
	// OpDLQ appends DLQ to the DLQ stream.
	OpDLQ
	// OpClaim claims Op.IdemKey for the job (idempotency); Result.Holder
	// names the job that holds it.
	OpClaim
	// OpAdmit takes one of the tenant's Op.Limit concurrency slots for the
	// job; Result.Admitted says whether it got one.
	OpAdmit
	// OpDowngrade moves a SUCCEEDED job to OUTPUT_QUARANTINED (the async
	// output scan found something) if it is still SUCCEEDED; Op.T carries
	// the reason (its one hop) and fields. Result.Step is OK or CONFLICT.
	OpDowngrade
	// OpPark parks a DISPATCHED or RUNNING job whose actor stops: its lock
	// (Op.LockValue) is then held through Op.Node's lease rather than
	// renewed, and the job waits in the node's parked set with Op.ParkDue
	// (unix ms) as its due time (parkScript). Result.Parked says whether
	// the caller still held the lock.
	OpPark
)

// The data of a state change is the core's and the store's alike; it
// lives in jobstate (see jobstate.Transition).
type (
	Hop        = jobstate.Hop
	Transition = jobstate.Transition
	ShardZAdd  = jobstate.ShardZAdd
	ShardHSet  = jobstate.ShardHSet
)

// Op is one unit of work for the Writer.
type Op struct {
	Kind  OpKind
	JobID string
	Node  string
	// LockValue identifies the owner for OpTransition and OpRelease.
	LockValue string
	// Held, when set, is the renewer's entry for JobID's lock of
	// LockValue (LockRenewer.HoldFor's handle): a write that gives the
	// lock up marks and settles it without looking the job up (see
	// releasing.go). Nil: looked up by JobID and LockValue.
	Held *HeldLock

	// OpActivate.
	Create  bool
	Topic   string
	Tenant  string
	TraceID string
	Request []byte

	// OpTransition, and the plan of an OpActivate that creates the job.
	T *Transition

	// OpClaim: the idempotency key and how long it is kept.
	IdemKey string
	IdemTTL time.Duration

	// OpAdmit: the tenant's active set and its limit.
	TenantKey string
	Limit     int
	// TenantRelease, when set on an OpTransition, gives the job's slot in
	// this tenant set back — only if the transition applies: a fenced or
	// conflicting write leaves the slot to whoever owns the job now. The
	// set is a global key, in another Redis Cluster slot than the job, so
	// the slot goes back right after the script's reply says it applied
	// (a retried op whose first try applied gives it back too). A node
	// that dies in between leaves the slot to the due poller's repair
	// (Store.RepairTenantSlots), as before.
	TenantRelease string

	// OpPark: when the parked job is due (its deadline, unix ms; ≤ 0: never).
	ParkDue int64

	// DLQ is the entry an OpDLQ appends. With an OpTransition or an
	// OpActivate that creates the job (Create and T set) it is written
	// exactly when the change applies, in the same atomic step, through the
	// job's DLQ outbox (see Keys.DLQOutbox and FlushDLQOutbox): a fenced
	// write, or the activation of a job that exists already, writes none.
	DLQ *DLQEntry

	// Done receives the outcome on a Writer goroutine. It must not block.
	// The outcome is the op's own storage (res): it stays valid until the
	// op is filled again, so whoever refills an op reads its outcome first.
	Done func(*Result)
	res  Result
	// split is the command that holds the op's part of a multi-job call's
	// reply (splitMulti), made at its first such call and kept across
	// Refill: an op refilled for each write makes it once.
	split *redis.Cmd

	cmds []redis.Cmder
	// cmdBuf is cmds' storage for the usual one command.
	cmdBuf [1]redis.Cmder
	// parkedOwner, when parkedOwnerKnown, is the node whose alive key and
	// parked set an OpActivate passes (activateCall.parkedOwner); else it
	// passes its own node's. A PARKED_BY reply sets it (see exec).
	parkedOwner      string
	parkedOwnerKnown bool
	// full: the OpActivate sends every key of activateScript. A create is
	// sent first with a new job's keys only (activateCall.newOnly); a FULL
	// reply sets it (see exec).
	full bool
	// outbox is DLQ as its outbox holds it, encoded once so a retry of the
	// op writes (and moves) the same entry.
	outbox     string
	outboxItem *outboxEntry
	// call is the script call of an OpActivate or OpTransition (hotCall),
	// from hotCalls, until exec hands the op its result: its send reads
	// the call's keys, through pointers, until the pipeline is written.
	call hotScriptCall
}

// Refill makes op src for its next write, keeping the storage op keeps
// for its replies (split). Call it only once the writer has done with op
// (its Done was called) or before its first Submit.
func (op *Op) Refill(src Op) {
	split := op.split
	*op = src
	op.split = split
}

// validate refuses side effects an op kind cannot make conditional on its
// change.
func (op *Op) validate() error {
	switch op.Kind {
	case OpTransition:
		if op.T == nil {
			return fmt.Errorf("store: transition %s without a transition", op.JobID)
		}
		return nil
	case OpActivate:
		if op.DLQ != nil && (op.T == nil || !op.Create) {
			return fmt.Errorf("store: activation %s: a DLQ entry needs a plan to apply", op.JobID)
		}
		if op.TenantRelease != "" {
			return fmt.Errorf("store: activation %s: no tenant slot to release", op.JobID)
		}
		return nil
	case OpDLQ:
		if op.DLQ == nil {
			return fmt.Errorf("store: dlq op %s without an entry", op.JobID)
		}
	}
	if op.TenantRelease != "" || (op.DLQ != nil && op.Kind != OpDLQ) {
		return fmt.Errorf("store: op kind %d of %s cannot carry a tenant release or DLQ entry", op.Kind, op.JobID)
	}
	return nil
}

// applied reports whether r says op's change applied — by this try, or by
// an earlier try of the same op whose reply was lost (Transition.Op) — so
// its side effects are owed.
func (op *Op) applied(r *Result) bool {
	if r == nil || r.Err != nil || op.T == nil {
		return false
	}
	own := op.T.Op != ""
	switch op.Kind {
	case OpTransition:
		return r.Step == StepOK ||
			(own && r.Step == StepConflict && r.LastOp == op.T.Op && r.Before == op.T.Final()) ||
			// It released the lock (a terminal write, say), and nobody
			// has taken it since.
			(own && r.Step == StepFenced && r.Before == "" && r.LastOp == op.T.Op && r.State == op.T.Final())
	case OpActivate:
		return r.Status == ActivateCreated ||
			(own && r.Status == ActivateAdopted && r.Fields["op"] == op.T.Op && r.State == op.T.Final())
	}
	return false
}

// ActivateStatus is the outcome of an activation.
type ActivateStatus string

const (
	ActivateCreated  ActivateStatus = "CREATED"
	ActivateAdopted  ActivateStatus = "ADOPTED"
	ActivateBusy     ActivateStatus = "BUSY"
	ActivateTerminal ActivateStatus = "TERMINAL"
	ActivateNotFound ActivateStatus = "NOTFOUND"
	// ActivateCancelled: the job had no record and a cancel mark for its
	// tenant (Store.MarkCancel): it was created CANCELLED, not with the
	// plan. Fields holds cancel_reason and cancelled_by.
	ActivateCancelled ActivateStatus = "CANCELLED"
)

// StepStatus is the outcome of a Transition.
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

	// OpActivate: Status, and State (for CREATED, where the plan left it).
	Status ActivateStatus
	State  jobstate.State
	Fence  int64
	// Holder is the lock value of the node that owns the job (BUSY), or for
	// OpClaim the job id that holds the idempotency key.
	Holder string
	// Fields is the job's record (ADOPTED only).
	Fields map[string]string

	// OpTransition: the outcome, and the state the job was in (for FENCED,
	// the current lock value). LastOp is the "op" field of the record on a
	// CONFLICT or FENCED: the identity of the write that moved the job
	// last; on a FENCED, State is the record's state.
	Step   StepStatus
	Before jobstate.State
	LastOp string

	// OpRelease.
	Released bool

	// OpAdmit.
	Admitted bool

	// OpPark.
	Parked bool
}

// OK reports whether the op applied (for a transition: Step is OK).
func (r *Result) OK() bool {
	return r.Err == nil && (r.Step == "" || r.Step == StepOK)
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

// Backlog is the number of ops queued and not yet taken into a pipeline.
func (w *Writer) Backlog() int { return len(w.ops) }

// Behind reports whether the Writer's backlog is at least an eighth of its
// queue (8,192 ops at WriterQueueDefault): Redis is behind, and every op
// queued is a job actor waiting in memory. The intake takes no more
// submits or results meanwhile (intake's admission gate), so the node's
// live actors, and its memory, stay bounded whatever the number of jobs
// whose results arrive at once.
func (w *Writer) Behind() bool { return len(w.ops) >= max(cap(w.ops)/8, 1) }

// ErrWriterClosed is the Result.Err of ops submitted after Close.
var ErrWriterClosed = errors.New("store: writer closed")

// Submit queues op. It waits while the queue is full.
func (w *Writer) Submit(op *Op) {
	if err := op.validate(); err != nil {
		op.Done(&Result{Err: err})
		return
	}
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

// activateSends bounds how often exec sends one activation: a PARKED_BY
// reply (the job's lock is parked by a node the call did not name) sends it
// again naming that node, which normally settles it; a lock that changes
// hands while parked between every send ends it with an error.
const activateSends = 3

func (w *Writer) exec(batch []*Op) {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	results := make([]*Result, len(batch))
	s := w.s
	s.markReleasing(batch, true)
	pending := batch
	for send := 1; len(pending) > 0; send++ {
		units := s.units(pending)
		items, loadErr := s.sendScripts(ctx, len(units), func(pipe redis.Pipeliner, u int) []redis.Cmder {
			return s.queueUnit(ctx, pipe, units[u])
		})
		var again []*Op
		for u, unit := range units {
			if len(unit) > 1 {
				multi := items[u].cmds[0].(*redis.Cmd)
				splitMulti(ctx, unit, multi)
				recycleMulti(multi.Args())
			}
			for _, op := range unit {
				if loadErr != nil && noScript(op.cmds) {
					results[indexOf(batch, op)] = &Result{Err: loadErr}
					continue
				}
				switch owner, status := resendStatus(op); {
				case status == activateFull && !op.full:
					// A create of a job that is not new: again, with
					// every key (this send does not count against
					// activateSends).
					op.full = true
					again = append(again, op)
					continue
				case status == activateParkedBy && send-fullSends(op) < activateSends:
					op.parkedOwner, op.parkedOwnerKnown = owner, true
					again = append(again, op)
					continue
				}
				results[indexOf(batch, op)] = s.decode(op, items[u].err)
			}
		}
		pending = again
	}
	// Before effects, which may turn an applied write's result into an
	// error (its tenant slot release failed): the lock is gone either way.
	s.settleReleasing(batch, results)
	w.s.effects(ctx, batch, results)
	for i, op := range batch {
		recycleArgs(op.cmds)
		op.cmds, op.cmdBuf[0] = nil, nil
		putHotCall(op)
		op.parkedOwner, op.parkedOwnerKnown, op.full = "", false, false
		op.Done(results[i])
	}
}

// indexOf returns op's index in batch. A resent op is rare, so a scan is
// cheap enough.
func indexOf(batch []*Op, op *Op) int {
	for i, o := range batch {
		if o == op {
			return i
		}
	}
	panic("store: op not in batch")
}

// resendStatus returns the status of op's reply when op is an activation
// that activateScript answered PARKED_BY (then with the node that parked
// the lock: the lock value's part before its first "|", as the script
// reads it) or FULL; "" otherwise.
func resendStatus(op *Op) (owner, status string) {
	if op.Kind != OpActivate || len(op.cmds) == 0 {
		return "", ""
	}
	// Read in place: every activation's reply passes here.
	var buf [8]string
	v, err := replyStrings(buf[:0], op.cmds[0].(*redis.Cmd))
	if err != nil || len(v) < 4 {
		return "", ""
	}
	switch v[0] {
	case activateParkedBy:
		owner, _, _ = strings.Cut(v[3], "|")
		return owner, activateParkedBy
	case activateFull:
		return "", activateFull
	}
	return "", ""
}

// fullSends is the number of op's sends that a FULL reply answered (0 or
// 1): they do not count against activateSends.
func fullSends(op *Op) int {
	if op.full {
		return 1
	}
	return 0
}

// multiMax caps the jobs of one multi-job script call (Writer.units): a
// call runs them all in one atomic step, during which Redis serves nothing
// else.
const multiMax = 64

// units splits ops into what one pipeline sends: each activation or
// transition with the others of its kind, up to multiMax, in one call of
// the kind's multi-job script (activateMultiScript, transitionMultiScript),
// whose fixed cost (EVALSHA's parsing, the script's call) they then share;
// every other op on its own. On Redis Cluster a call's keys must be in one
// slot, so only jobs of one shard (one hash tag) are grouped. A unit of one
// op is sent as that op's own commands (queue).
func (s *Store) units(ops []*Op) [][]*Op {
	type group struct {
		kind  OpKind
		shard int
	}
	var units [][]*Op
	open := map[group]int{} // the unit of each group still taking ops
	for _, op := range ops {
		if s.single || op.Kind != OpActivate && op.Kind != OpTransition {
			units = append(units, []*Op{op})
			continue
		}
		g := group{kind: op.Kind}
		if s.cluster {
			g.shard = Shard(op.JobID)
		}
		if u, ok := open[g]; ok && len(units[u]) < multiMax {
			units[u] = append(units[u], op)
			continue
		}
		open[g] = len(units)
		units = append(units, []*Op{op})
	}
	return units
}

// queueUnit adds unit's commands to pipe (see units) and returns them: a
// single op's own, or a grouped unit's one multi-job call. splitMulti hands
// that call's replies to the unit's ops.
func (s *Store) queueUnit(ctx context.Context, pipe redis.Pipeliner, unit []*Op) []redis.Cmder {
	if len(unit) == 1 {
		s.queue(ctx, pipe, unit[0])
		return unit[0].cmds
	}
	now := time.Now().UnixMilli()
	calls := make([]packer, len(unit))
	for i, op := range unit {
		op.cmds = op.cmdBuf[:0]
		calls[i] = s.hotCall(op, now, s.outbox(op, now))
	}
	sc := activateMultiScript
	if unit[0].Kind == OpTransition {
		sc = transitionMultiScript
	}
	return []redis.Cmder{evalShaMulti(ctx, pipe, sc, calls)}
}

// evalShaMulti sends calls, or queues them on a pipeline, as one EVALSHA of
// sc, the multi-job variant of their script (see lua/lib/multi.lua): every
// job's keys, then one argument that packs every job's arguments
// (packedargs.go).
func evalShaMulti(ctx context.Context, c processor, sc *redis.Script, calls []packer) *redis.Cmd {
	nkeys := 0
	for _, call := range calls {
		nkeys += call.keyCount()
	}
	args := multiArgLists.get(4 + nkeys)
	args = append(args, "evalsha", luaHashes[sc], nkeys)
	for _, call := range calls {
		args = call.appendKeys(args)
	}
	// One packedArgs a call (it escapes, through the calls' packArgs).
	p := &packedArgs{b: appendPackedHeader(getPackedBuf(), len(calls))}
	for _, call := range calls {
		p.packJob(call)
	}
	args = append(args, p.b)
	cmd := redis.NewCmd(ctx, args...)
	cmd.SetFirstKeyPos(3)
	_ = c.Process(ctx, cmd)
	return cmd
}

// recycleMulti hands back a multi-job call's argument list and its packed
// arguments, once its reply is split: nothing reads them again.
func recycleMulti(args []interface{}) {
	if n := len(args); n > 0 {
		if b, ok := args[n-1].([]byte); ok {
			putPackedBuf(b)
		}
	}
	multiArgLists.put(args)
}

// splitMulti gives each op of unit its own reply of the unit's multi-job
// call: a command of its own that holds its element of the call's reply
// (an error element as the command's error), or the call's error, so that
// parkedBy, noScript and decode read it as a call of its own.
func splitMulti(ctx context.Context, unit []*Op, multi *redis.Cmd) {
	var vals []interface{}
	err := multi.Err()
	if err == nil {
		var ok bool
		if vals, ok = multi.Val().([]interface{}); !ok || len(vals) != len(unit) {
			err = fmt.Errorf("store: multi-job call of %d jobs: bad reply %v", len(unit), multi.Val())
		}
	}
	for i, op := range unit {
		c := op.split
		if c == nil {
			c = redis.NewCmd(ctx, multiReplyArgs...)
			op.split = c
		}
		c.SetVal(nil)
		c.SetErr(nil)
		switch {
		case err != nil:
			c.SetErr(err)
		default:
			if e, ok := vals[i].(error); ok {
				c.SetErr(e)
			} else {
				c.SetVal(vals[i])
			}
		}
		op.cmds = append(op.cmdBuf[:0], c)
	}
}

// multiReplyArgs are the arguments of each command that splitMulti makes:
// a name for its errors, shared (nothing writes them).
var multiReplyArgs = []interface{}{"evalsha"}

// outbox returns the shard write that puts op's DLQ entry in its job's
// outbox (nil without one), encoding the entry on op's first send.
func (s *Store) outbox(op *Op, now int64) *ShardZAdd {
	if op.DLQ == nil || op.Kind == OpDLQ {
		return nil
	}
	if op.outbox == "" {
		op.outbox = encodeOutbox(op.DLQ)
		op.outboxItem, _ = decodeOutbox(op.outbox)
	}
	return &ShardZAdd{Suffix: dlqOutboxSuffix, Score: now, Member: op.outbox}
}

// hotScriptCall is a *activateCall or *transitionCall.
type hotScriptCall interface {
	scriptCall
	argsAppender
	packer
}

// hotCalls recycle the script calls of activations and transitions (a
// few hundred bytes each, two a job): an op takes one on its first send
// (hotCall) and gives it back before its Done (putHotCall).
var hotCalls = struct{ act, tr sync.Pool }{
	act: sync.Pool{New: func() any { return new(activateCall) }},
	tr:  sync.Pool{New: func() any { return new(transitionCall) }},
}

// putHotCall gives op's script call back to hotCalls, cleared, so that it
// holds nothing of the job (its request, its transition).
func putHotCall(op *Op) {
	switch c := op.call.(type) {
	case *activateCall:
		*c = activateCall{}
		hotCalls.act.Put(c)
	case *transitionCall:
		*c = transitionCall{}
		hotCalls.tr.Put(c)
	}
	op.call = nil
}

// hotCall returns the script call of an OpActivate or OpTransition, in the
// op's call (see hotCalls).
func (s *Store) hotCall(op *Op, now int64, outbox *ShardZAdd) hotScriptCall {
	k := s.keys
	sh := Shard(op.JobID)
	if op.Kind == OpActivate {
		// The plan's state: where a created job's index entry goes.
		planEnd := jobstate.StatePending
		if op.T != nil && len(op.T.Path) > 0 {
			planEnd = op.T.Final()
		}
		parkedOwner := op.Node
		if op.parkedOwnerKnown {
			parkedOwner = op.parkedOwner
		}
		call, _ := op.call.(*activateCall)
		if call == nil {
			putHotCall(op)
			call = hotCalls.act.Get().(*activateCall)
			op.call = call
		}
		jobKey, lockKey, markKey := k.jobKeys(sh, op.JobID)
		*call = activateCall{
			jobKey: jobKey, lockKey: lockKey, dueKey: k.Due(sh),
			leasesKey: k.Leases(sh), indexKey: k.Index(sh, string(planEnd)),
			ownerAliveKey: k.Alive(sh, parkedOwner), ownerParkedKey: k.Parked(sh, parkedOwner),
			markKey: markKey, cancelledKey: k.Index(sh, string(jobstate.StateCancelled)), newOnly: op.Create && !op.full,
			node: op.Node, nowMs: now, lockTTLMs: s.cfg.LockTTL.Milliseconds(), create: op.Create, jobID: op.JobID,
			topic: op.Topic, tenant: op.Tenant, traceID: op.TraceID, request: op.Request,
			rescueAtMs: time.Now().Add(s.cfg.RescueAfter).UnixMilli(), lockAfter: op.T.LockAfter(), dueMs: due(op.T),
			parkedOwner: parkedOwner,
			plan:        planArgs{t: op.T, tag: k.Tag(op.JobID), extra: outbox}}
		return call
	}
	call, _ := op.call.(*transitionCall)
	if call == nil {
		putHotCall(op)
		call = hotCalls.tr.Get().(*transitionCall)
		op.call = call
	}
	jobKey, lockKey, _ := k.jobKeys(sh, op.JobID)
	*call = transitionCall{
		jobKey: jobKey, lockKey: lockKey, dueKey: k.Due(sh),
		toIndexKey: k.Index(sh, string(op.T.Final())),
		lockValue:  op.LockValue, node: op.Node, expected: op.T.Expect, nowMs: now, jobID: op.JobID,
		lockAfter: op.T.LockAfter(), dueMs: due(op.T),
		plan: planArgs{t: op.T, tag: k.Tag(op.JobID), extra: outbox}}
	call.fromIndexKeys = appendExpectedIndexes(call.fromBuf[:0], k, sh, op.T.Expect)
	return call
}

// queue adds op's commands to pipe.
func (s *Store) queue(ctx context.Context, pipe redis.Pipeliner, op *Op) {
	op.cmds = op.cmdBuf[:0]
	k := s.keys
	now := time.Now().UnixMilli()
	outbox := s.outbox(op, now)
	sh := Shard(op.JobID)
	switch op.Kind {
	case OpActivate, OpTransition:
		op.cmds = append(op.cmds, evalSha(ctx, pipe, s.hotCall(op, now, outbox)))
	case OpRelease:
		op.cmds = append(op.cmds, evalSha(ctx, pipe, releaseCall{lockKey: k.Lock(op.JobID),
			leasesKey: k.Leases(sh), dueKey: k.Due(sh), lockValue: op.LockValue, jobID: op.JobID}))
	case OpPark:
		op.cmds = append(op.cmds, evalSha(ctx, pipe, parkCall{lockKey: k.Lock(op.JobID), leasesKey: k.Leases(sh),
			parkedKey: k.Parked(sh, op.Node), aliveKey: k.Alive(sh, op.Node), dueKey: k.Due(sh),
			lockValue: op.LockValue, jobID: op.JobID, dueMs: parkDue(op.ParkDue), leaseTTLMs: s.cfg.LockTTL.Milliseconds()}))
	case OpClaim:
		ttl := int64(op.IdemTTL / time.Second)
		if ttl <= 0 {
			ttl = int64(RetentionDefault / time.Second)
		}
		op.cmds = append(op.cmds, evalSha(ctx, pipe, claimCall{idemKey: op.IdemKey, jobID: op.JobID, ttlS: ttl}))
	case OpAdmit:
		op.cmds = append(op.cmds, evalSha(ctx, pipe, admitCall{activeKey: op.TenantKey, jobID: op.JobID, limit: op.Limit, nowMs: now}))
		if _, known := s.tenants.Load(op.TenantKey); !known {
			op.cmds = append(op.cmds, pipe.SAdd(ctx, k.Tenants(), op.TenantKey))
		}
	case OpDowngrade:
		op.cmds = append(op.cmds, evalSha(ctx, pipe, downgradeCall{jobKey: k.Job(op.JobID),
			fromIndexKey: k.Index(sh, string(jobstate.StateSucceeded)), toIndexKey: k.Index(sh, string(jobstate.StateOutputQuarantined)),
			nowMs: now, reason: string(op.T.Path[0].Reason), node: op.Node, jobID: op.JobID, fields: op.T.Fields}))
	case OpDLQ:
		op.cmds = append(op.cmds, s.addDLQ(ctx, pipe, op.DLQ))
	}
}

// effects carries out the side effects of the ops in batch whose change
// applied (Op.TenantRelease, and moving Op.DLQ from the job's outbox to the
// DLQ stream), in one pipeline after the scripts' replies: the tenant set
// and the stream are global keys, in other Redis Cluster slots than the
// job. Both are idempotent. An op whose slot release failed gets the error
// as its Result, so its owner tries the op again, finds its own earlier
// write (Op.applied) and its effects are made again; a DLQ entry that could
// not be moved stays in its outbox for the flush (FlushDLQOutbox).
func (s *Store) effects(ctx context.Context, batch []*Op, results []*Result) {
	type effect struct {
		i       int
		release *redis.IntCmd
		dlq     *redis.Cmd
	}
	var todo []effect
	var pipe redis.Pipeliner
	for i, op := range batch {
		if (op.TenantRelease == "" && op.outboxItem == nil) || !op.applied(results[i]) {
			continue
		}
		if pipe == nil {
			pipe = s.rdb.Pipeline()
		}
		e := effect{i: i}
		if op.TenantRelease != "" {
			e.release = pipe.ZRem(ctx, op.TenantRelease, op.JobID)
		}
		if op.outboxItem != nil {
			e.dlq = s.appendOutboxed(ctx, pipe, op.outboxItem)
		}
		todo = append(todo, e)
	}
	if pipe == nil {
		return
	}
	_, _ = pipe.Exec(ctx)
	var clear redis.Pipeliner
	for _, e := range todo {
		op := batch[e.i]
		var err error
		if e.dlq != nil {
			if e.dlq.Err() == nil {
				if clear == nil {
					clear = s.rdb.Pipeline()
				}
				clear.ZRem(ctx, s.keys.DLQOutbox(Shard(op.JobID)), op.outbox)
			}
			// Otherwise (Redis out of memory, say) the entry waits in its
			// outbox, durable, for the due poller's flush: the job's own
			// write applied and is not tried again for it.
		}
		if e.release != nil && e.release.Err() != nil && err == nil {
			err = fmt.Errorf("store: tenant slot release %s: %w", op.JobID, e.release.Err())
		}
		if err != nil {
			results[e.i] = &Result{Err: err}
		}
	}
	if clear != nil {
		// An entry left in its outbox is in the stream already; the flush
		// removes it later (its mark keeps it from being appended twice).
		_, _ = clear.Exec(ctx)
	}
}

func due(t *Transition) int64 {
	if t == nil {
		return 0
	}
	return t.Due
}

// replyStrings appends the elements of a script's array reply of strings
// to dst: what Cmd.StringSlice reads, into the caller's storage (a job's
// two script replies were two slices per job). A job's reply of a
// multi-job call is the array packed in one string (lua/lib/multi.lua),
// read in place: the elements are parts of it.
func replyStrings(dst []string, c *redis.Cmd) ([]string, error) {
	if packed, ok := c.Val().(string); ok && c.Err() == nil {
		return appendPackedReply(dst, packed)
	}
	vals, err := c.Slice()
	if err != nil {
		return nil, err
	}
	for _, v := range vals {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("reply element %v (%T) is not a string", v, v)
		}
		dst = append(dst, s)
	}
	return dst, nil
}

// decode turns op's command replies into a Result.
func (s *Store) decode(op *Op, execErr error) *Result {
	r := &op.res // no Result allocated per op (see Op.Done)
	*r = Result{}
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
		var buf [8]string
		v, err := replyStrings(buf[:0], op.cmds[0].(*redis.Cmd))
		if err != nil || len(v) < 4 || len(v)%2 != 0 {
			r.Err = fmt.Errorf("store: activate %s: bad reply %v (%v)", op.JobID, op.cmds[0].(*redis.Cmd).Val(), err)
			return r
		}
		if v[0] == activateFull {
			r.Err = fmt.Errorf("store: activate %s: FULL to a call with every key", op.JobID)
			return r
		}
		if v[0] == activateParkedBy {
			r.Err = fmt.Errorf("store: activate %s: another node had parked its lock at each of %d sends (last %s)",
				op.JobID, activateSends, v[3])
			return r
		}
		r.Status, r.State, r.Holder = ActivateStatus(v[0]), jobstate.State(v[1]), v[3]
		r.Fence, _ = strconv.ParseInt(v[2], 10, 64)
		if len(v) > 4 {
			r.Fields = make(map[string]string, (len(v)-4)/2)
			for i := 4; i+1 < len(v); i += 2 {
				r.Fields[v[i]] = v[i+1]
			}
			ExpandRecord(r.Fields)
		}
	case OpTransition, OpDowngrade:
		var buf [4]string
		v, err := replyStrings(buf[:0], op.cmds[0].(*redis.Cmd))
		if err != nil || len(v) < 2 {
			r.Err = fmt.Errorf("store: transition %s: bad reply %v (%v)", op.JobID, op.cmds[0].(*redis.Cmd).Val(), err)
			return r
		}
		r.Step, r.Before = StepStatus(v[0]), jobstate.State(v[1])
		if len(v) > 2 {
			r.LastOp = v[2]
		}
		if len(v) > 3 {
			r.State = jobstate.State(v[3])
		}
	case OpRelease:
		n, _ := op.cmds[0].(*redis.Cmd).Int64()
		r.Released = n == 1
	case OpPark:
		n, _ := op.cmds[0].(*redis.Cmd).Int64()
		r.Parked = n == 1
	case OpClaim:
		r.Holder, _ = op.cmds[0].(*redis.Cmd).Text()
	case OpAdmit:
		n, _ := op.cmds[0].(*redis.Cmd).Int64()
		r.Admitted = n == 1
		if len(op.cmds) > 1 { // the tenant's key is in Keys.Tenants now
			s.tenants.Store(op.TenantKey, struct{}{})
		}
	}
	return r
}
