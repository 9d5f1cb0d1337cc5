// Package intake is where bus messages enter a node. It takes the submit,
// result and cancel streams (JetStream work queues, one durable consumer
// each, shared by every replica), the workers' heartbeats and progress (core
// NATS) and the results and cancels other replicas forward to this node, and
// turns each into a message for the job's shard (supervisor.Deliver) or for
// the router. Bad input goes no further: it is logged with its reason,
// written to the DLQ and acked.
//
// One duty a file:
//   - intake.go: the Intake and its handlers — size, decode, signature,
//     payload and validation checks, then routing to the job's shard; the
//     wakes and reminders other parts of the node send through it (Tell,
//     Wake, WakeOrphan, RememberParked);
//   - consume.go: what the intake subscribes to and the stream fetch loops
//     it starts;
//   - guard.go: the processed-message guard, so a message handled but not
//     acked before a crash is acked, not handled again, when redelivered;
//   - validate.go: the limits on ids, topics, tenants, labels, env and
//     packet size (also used by the admin API and the node's own ids);
//   - signatures.go: CAP packet signature checks and what a rejection does
//     to each kind of packet;
//   - inbox.go: the forwarding inbox, both sides — Forwarder, which job
//     actors use to hand an event to the job's owner, and HandleInbox, the
//     owner's intake of it;
//   - own.go: the node's own subscription to the result subject (every
//     result, its own jobs' kept) and the settling of the shared
//     consumer's copies by their job's record;
//   - inbox_batch.go: batches of forwarded events — BatchForwarder, which
//     the Resolver uses to hand one owner several events in one request,
//     the framing, and the owner's answer of one outcome per event.
//
// What it does not do: decide anything about a job (the job actor and its
// decision core, packages jobactor and lifecycle); spawn, supervise or
// stop actors (package supervisor); find jobs that need waking — due,
// orphaned, parked or left by a dead node (package recovery, which wakes
// them through the Intake); create streams and consumers or run the fetch
// loop itself (package bus).
package intake
