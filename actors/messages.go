// Package actors holds the job actor — one supervised actor per in-flight
// job, owner of the job's state machine and of its Redis lock — and the
// messages it exchanges.
package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/store"
)

// Delivery is the JetStream message an event came in, as the job actor sees
// it. The actor acks only once the event's effect is durable in Redis.
type Delivery interface {
	Ack() error
	NakWithDelay(delay time.Duration) error
	InProgress() error
}

// Submit is a JobRequest taken from sys.job.submit.
type Submit struct {
	Req      *capv1.JobRequest
	TraceID  string
	Delivery Delivery
}

// Result is a JobResult taken from sys.job.result.
type Result struct {
	Res      *capv1.JobResult
	TraceID  string
	Delivery Delivery
	// Raw is the packet as received, for forwarding to the owning node.
	Raw []byte
	// Forwarded marks a result another node passed to this one (the owner);
	// it is never forwarded again.
	Forwarded bool
}

// Progress is a JobProgress seen on sys.job.progress (core NATS, no ack).
type Progress struct{ P *capv1.JobProgress }

// Cancel is a JobCancel taken from sys.job.cancel.
type Cancel struct {
	C         *capv1.JobCancel
	TraceID   string
	Delivery  Delivery
	Raw       []byte
	Forwarded bool
}

// Forward kinds, as carried in the Troupe-Kind header of a forwarded packet.
const (
	ForwardResult = "result"
	ForwardCancel = "cancel"
)

// Wake is sent by the due poller to a job whose due time has passed and
// whose owner did not act (it died, or the job was passivated and an
// approval arrived). The actor activates the job and does what its state
// calls for.
type Wake struct {
	// LapsedAt, for a job woken because its owner stopped renewing its
	// lease: when the owner's lock lapsed (for troupe_adoption_latency_seconds).
	LapsedAt time.Time
}

// Finished tells the job's supervisor that the actor has nothing left to do
// and may be stopped. The supervisor stops it with a poison pill, so anything
// already queued for it is still handled.
type Finished struct {
	JobID string
	PID   *actor.PID
	// Parked: the job stays DISPATCHED on this node with no live actor (see
	// JobActor.park). The shard remembers it, so that the worker's progress
	// or eviction — events that only the dispatching node acts on — spawn
	// an actor for it again.
	Parked bool
	// Redeliver holds such events that reached the actor while it was
	// parking the job: the shard hands them to the job's next actor.
	Redeliver []interface{}
}

// storeDone carries a store.Writer outcome back into the actor.
type storeDone struct {
	epoch uint64
	res   *store.Result
}

// wake is the job's wheel timer firing (a retry, a deadline).
type wake struct{ epoch uint64 }

// lockLost is sent by the lock renewer when the job's lock could not be kept.
type lockLost struct {
	lockValue string
	vanished  bool // nobody holds it any more (not: another holder has it)
}

// Crash makes the job actor panic. It exists for fault-injection tests of
// supervision; nothing in a node sends it. A transient crash (the default)
// is restarted: the fresh actor has empty memory and recovers from Redis. A
// Fatal one is stopped, and its supervisor marks the job FAILED.
type Crash struct{ Fatal bool }

// WorkerLost tells a job that the worker it was dispatched to has been
// evicted (no heartbeat within its liveness window). A job still waiting
// for that worker to start it is dispatched elsewhere.
type WorkerLost struct{ WorkerID string }

// policyDone carries a remote input policy's answer back into the actor.
type policyDone struct {
	epoch uint64
	dec   *capv1.PolicyCheckResponse
	err   error
}

// outputDone carries the output policy's phase-1 outcome back into the actor.
type outputDone struct {
	epoch   uint64
	outcome safety.OutputOutcome
	res     *Result
	path    []store.Hop
}
