package jobactor

import (
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
	return &store.Op{Kind: opKinds[o.Kind], JobID: o.JobID, Node: o.Node, LockValue: o.LockValue,
		Create: o.Create, Topic: o.Topic, Tenant: o.Tenant, TraceID: o.TraceID, Request: o.Request,
		T: o.T, DLQ: o.DLQ, TenantRelease: o.TenantRelease,
		IdemKey: o.IdemKey, TenantKey: o.TenantKey, Limit: o.Limit, ParkDue: o.ParkDue}
}

// writeResult is the core's view of a store op's outcome.
func writeResult(r *store.Result) lifecycle.WriteResult {
	return lifecycle.WriteResult{Err: r.Err, Status: lifecycle.ActivateStatus(r.Status), State: r.State,
		Fence: r.Fence, Holder: r.Holder, Fields: r.Fields, Step: lifecycle.StepStatus(r.Step),
		Before: r.Before, LastOp: r.LastOp, Released: r.Released, Admitted: r.Admitted, Parked: r.Parked}
}
