package jobactor

import (
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/store"
)

// The core's writes, as the store's writer takes them, and their outcomes
// back: the core names no store type (see lifecycle.Op).

var opKinds = [...]store.OpKind{
	lifecycle.OpActivate:   store.OpActivate,
	lifecycle.OpTransition: store.OpTransition,
	lifecycle.OpRelease:    store.OpRelease,
	lifecycle.OpDLQ:        store.OpDLQ,
	lifecycle.OpClaim:      store.OpClaim,
	lifecycle.OpAdmit:      store.OpAdmit,
	lifecycle.OpPark:       store.OpPark,
}

// storeOp is the store op for the core's write o (without Done).
func storeOp(o *lifecycle.Op) *store.Op {
	op := new(store.Op)
	fillStoreOp(op, o)
	return op
}

// fillStoreOp makes dst the store op for the core's write o (without
// Done), overwriting all of dst: what the writer kept in it for an earlier
// write (its commands, its DLQ outbox entry) goes with it, but for the
// storage of its replies (store.Op.Refill).
func fillStoreOp(dst *store.Op, o *lifecycle.Op) {
	dst.Refill(store.Op{Kind: opKinds[o.Kind], JobID: o.JobID, Node: o.Node, LockValue: o.LockValue,
		Create: o.Create, Topic: o.Topic, Tenant: o.Tenant, TraceID: o.TraceID, Request: o.Request,
		T: o.T, DLQ: o.DLQ, TenantRelease: o.TenantRelease,
		IdemKey: o.IdemKey, TenantKey: o.TenantKey, Limit: o.Limit, ParkDue: o.ParkDue})
}

// writeOp is a job actor's store op for its core's answered writes (those
// with an epoch), with the completion that sends the outcome back as a
// WriteDone. A job has at most one such write outstanding, so the actor
// keeps one writeOp and refills it for each write once the writer is done
// with the last: no store op and no completion closure allocated per write.
// A write that finds the last one still with the writer (it cannot, while
// the core keeps one write outstanding; a restarted actor starts with none)
// gets a writeOp of its own.
type writeOp struct {
	op    store.Op
	of    *lifecycle.Op // the core's write op was filled from
	epoch uint64        // the write's epoch, read by complete
	self  *actor.PID
	root  *actor.RootContext
	// inFlight: submitted and not yet completed (the writer may still
	// read op).
	inFlight atomic.Bool
	done     func(*store.Result) // complete, bound once
	// msg is the WriteDone complete sends when it is free (msgOut false):
	// msgOut is set when it is sent and cleared by the actor once a step
	// has handled it (consumed), so a completion never overwrites an
	// answer its actor has not read; one that finds it out sends a
	// WriteDone of its own. An answer never read (its actor stopped first)
	// keeps the writeOp out of the pool (release).
	msg    lifecycle.WriteDone
	msgOut atomic.Bool
}

// writeOps keeps the writeOps of stopped job actors for the next jobs' (a
// writeOp and its bound completion are two allocations a job otherwise).
var writeOps = sync.Pool{New: func() any {
	w := &writeOp{}
	w.done = w.complete
	return w
}}

func newWriteOp(self *actor.PID, root *actor.RootContext) *writeOp {
	w := writeOps.Get().(*writeOp)
	w.self, w.root = self, root
	return w
}

// release gives w back for another actor once its actor stops; one still
// with the writer is left to the garbage collector.
func (w *writeOp) release() {
	if w.inFlight.Load() || w.msgOut.Load() {
		return
	}
	w.op.Refill(store.Op{})
	w.of, w.self, w.root = nil, nil, nil
	writeOps.Put(w)
}

// complete is the op's Done, on a writer goroutine: the writer has finished
// with the op, and its outcome goes to the job's actor. Everything it needs,
// the outcome (the op's own storage) included, is read before the op is
// marked free: from then on the op may be refilled, or given to another
// actor.
func (w *writeOp) complete(r *store.Result) {
	var done *lifecycle.WriteDone
	if w.msgOut.CompareAndSwap(false, true) {
		done = &w.msg
	} else {
		done = new(lifecycle.WriteDone)
	}
	*done = lifecycle.WriteDone{Epoch: w.epoch, Res: writeResult(r)} // r is the op's: read it first
	self, root := w.self, w.root
	w.inFlight.Store(false)
	root.Send(self, done)
}

// consumed tells w that its actor has handled m: if m is w's own answer,
// the next completion may send it again. The actor calls it after the
// step that read m (the core keeps no pointer to an event).
func (w *writeOp) consumed(m *lifecycle.WriteDone) {
	if w != nil && m == &w.msg {
		// Drop what the answer references (an adopted job's record, an
		// error) before the op may hold it for the actor's whole life or
		// in the pool.
		w.msg = lifecycle.WriteDone{}
		w.msgOut.Store(false)
	}
}

// writeResult is the core's view of a store op's outcome.
func writeResult(r *store.Result) lifecycle.WriteResult {
	return lifecycle.WriteResult{Err: r.Err, Status: lifecycle.ActivateStatus(r.Status), State: r.State,
		Fence: r.Fence, Holder: r.Holder, Fields: r.Fields, Step: lifecycle.StepStatus(r.Step),
		Before: r.Before, LastOp: r.LastOp, Released: r.Released, Admitted: r.Admitted, Parked: r.Parked}
}
