// Package jobactor holds the job actor — one supervised actor per in-flight
// job, owner of the job's state machine and of its Redis lock — and the
// messages it exchanges.
package jobactor

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/lifecycle"
)

// The job's events and the delivery they came in are the decision core's
// (package lifecycle); these aliases keep their old names for intake, the
// due poller and the router's callers.
type (
	Delivery    = lifecycle.Delivery
	Submit      = lifecycle.Submit
	Result      = lifecycle.Result
	Progress    = lifecycle.Progress
	Cancel      = lifecycle.Cancel
	Wake        = lifecycle.Wake
	WorkerLost  = lifecycle.WorkerLost
	ResultsLost = lifecycle.ResultsLost
	Abandon     = lifecycle.Abandon
	// Tokens is the rate limiter's answer; for a parked job's ask it
	// reaches the shard (Redeliver) and spawns the job's next actor.
	Tokens = lifecycle.Tokens
)

// Forward kinds, as carried in the Troupe-Kind header of a forwarded packet.
const (
	ForwardResult = lifecycle.ForwardResult
	ForwardCancel = lifecycle.ForwardCancel
)

// Finished tells the job's supervisor that the actor has nothing left to do
// and may be stopped. The supervisor stops it with a poison pill, so anything
// already queued for it is still handled.
type Finished struct {
	JobID string
	PID   *actor.PID
	// Parked: the job stays DISPATCHED or RUNNING (or SCHEDULED waiting
	// for rate limit tokens) on this node with no live actor (see
	// lifecycle.Job.park, parkTokens). The shard remembers it, so that the worker's progress
	// or eviction — events that only the dispatching node acts on — spawn
	// an actor for it again.
	Parked bool
	// Running (with Parked): the job parked in RUNNING, so only its
	// worker's eviction wakes it.
	Running bool
	// Redeliver holds such events that reached the actor while it was
	// parking the job: the shard hands them to the job's next actor.
	Redeliver []interface{}
}

// Redeliver hands the shard events that reached a job's actor after it
// parked the job (the worker's first progress, its eviction), and the rate
// limiter's answer to a parked job's ask (a *Tokens, which spawns an actor
// whether or not the shard remembers the job parked): they go to the job's
// next actor.
type Redeliver struct {
	JobID string
	Msgs  []interface{}
}

// Crash makes the job actor panic. It exists for fault-injection tests of
// supervision; nothing in a node sends it. A transient crash (the default)
// is restarted: the fresh actor has empty memory and recovers from Redis. A
// Fatal one is stopped, and its supervisor marks the job FAILED.
type Crash struct{ Fatal bool }
