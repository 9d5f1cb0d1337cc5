package lifecycle

import (
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The messages between a job and the router (internal/router aliases
// them): the core asks for a worker with a PickRequest (an AskRouter
// effect) and hears a PickReply or, queued, a Placed; it tells the router
// what became of a placement with Took, Withdraw, Occupied and Released
// (ToRouter effects).

// PickRequest asks the router for a worker. Send it with ctx.Request so the
// reply (a *PickReply) comes back to the asking job actor as a message.
type PickRequest struct {
	JobID string
	Req   *capv1.JobRequest
	// Epoch is echoed in the reply so the job can drop answers to questions
	// it no longer asks.
	Epoch uint64
	// Wait: when the job's pools have no room (Waitable reasons), queue the
	// job and place it the moment they do; the reply says Queued, and the
	// placement comes later as a *Placed sent to the asking actor, carrying
	// Ticket. A job already queued keeps its place (the ask is a recheck).
	Wait   bool
	Ticket uint64
	// Submitted orders a waiting job among its tenant's (oldest first):
	// when the job was created, as its record says on every replica.
	Submitted time.Time
}

// PickReply answers a PickRequest: WorkerID and Subject on success, or a
// Reason saying why there is no worker (see Permanent for how to treat it).
type PickReply struct {
	Epoch    uint64
	WorkerID string
	// Pool is the picked worker's pool (the job records it: on a pool
	// subject a worker key of that pool may speak for the job first).
	Pool    string
	Subject string
	// Resend: Subject reaches exactly the picked worker and that worker
	// dedupes by job id (the worker registry's dedupe label), so the dispatch may be
	// repeated until the job shows it arrived.
	Resend bool
	// StartsOnDelivery: the worker sends no progress (the registry's progress label
	// absent), so the job counts as started once delivered and is bounded
	// by the run's timeout from dispatch.
	StartsOnDelivery bool
	Reason           jobstate.Reason
	Detail           string
	// Queued: no room now; the job waits in its pools' queue and will get
	// a *Placed (QueuePosition says where it stands: a walk of the queue,
	// so it is not computed for every reply).
	Queued bool
}

// Placed tells a queued job that it has a worker: Reply is what a pick
// would have answered (its Epoch is meaningless). The job answers Took.
// A Reply with a Reason means the job can no longer wait (its topic was
// unmapped meanwhile, say).
type Placed struct {
	JobID  string
	Ticket uint64
	Reply  *PickReply
}

// Took answers a Placed: Used says the job takes the placement; otherwise
// (it no longer waits, or the ticket is not its own) the slot is freed.
type Took struct {
	JobID    string
	WorkerID string
	Ticket   uint64
	Used     bool
}

// Withdraw takes a job out of the wait queue (it was cancelled, or its
// actor stops). A placement already sent to it is freed.
type Withdraw struct {
	JobID  string
	Ticket uint64
}

// Occupied tells the router that a job of this node holds a slot on
// WorkerID although this router did not place it there (the job was adopted
// from another node, or this node restarted), so the slot counts until the
// job's answer.
//
// For a worker this router has evicted, the job is lost with it as of the
// eviction (OnEvictJobs) — unless Heard: the worker itself just spoke for
// the job, so it is alive and its next heartbeat brings it back.
type Occupied struct {
	WorkerID string
	JobID    string
	Started  bool
	Heard    bool
}

// Released tells the router that a job it placed on WorkerID no longer
// waits for that worker to start it (the job is RUNNING, finished, or gone
// from this node), so the worker's eviction need not re-dispatch it.
type Released struct {
	WorkerID string
	JobID    string
	// Done: the job no longer occupies the worker (it ended, or goes to be
	// placed again); its dispatch stops counting against the worker's load.
	Done bool
	// Linger (with Done): the job ended without the worker's answer
	// (cancelled, timed out), so the worker may still be running it. Its
	// slot stays counted until the worker answers after all (the result
	// frees it when seen) or its heartbeats show it gone — for workers
	// that report active_jobs; for others it is freed now.
	Linger bool
}

// Permanent reports whether a routing failure will not fix itself without a
// change of config or of the job: no pool is mapped to the topic, the
// preferred pool is not one of them, or no mapped pool provides what the
// job requires. The job fails such a job (after a short grace window for
// rollout races) instead of backing off. Every other reason is transient,
// and so is any reason this function does not know.
func Permanent(r jobstate.Reason) bool {
	switch r {
	case jobstate.ReasonTopicUnmapped, jobstate.ReasonPreferredPoolUnmapped, jobstate.ReasonRequiresUnsatisfied:
		return true
	}
	return false
}
