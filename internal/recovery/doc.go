// Package recovery finds the jobs nobody is acting on and wakes them, so
// that a job whose node died, whose timer was lost with its actor, or which
// waits parked with no actor at all still reaches its next step. Everything
// it finds is in Redis; it hands each job to the node's intake (the Intake
// interface: Wake, WakeOrphan, RememberParked), which routes it to the job's
// shard.
//
// The DuePoller runs the duties once per tick (one replica at a time holds
// its lock; only the parked poll runs on every node), every DuePoll while
// ticks wake jobs and up to IdleEvery apart while they find nothing, one
// duty a file:
//   - due.go: the poller, its lock and its tick; due wakes — retries,
//     deadlines and approvals whose due time has passed without their owner
//     acting — and the count of overdue jobs by state (troupe_stale_jobs);
//   - orphans.go: jobs whose lease lapsed (their owner died), woken with
//     the time it lapsed;
//   - deadnodes.go: the parked jobs of dead nodes, adopted at a bounded rate,
//     and the dead node forgotten once it has none left;
//   - parked.go: this node's own parked jobs whose deadline has come, and,
//     once at start, the jobs an earlier run of this node parked in
//     DISPATCHED, handed back to the shards' memory (RememberParked);
//   - housekeep.go: every TrimEvery poll intervals, the terminal-index trim, the DLQ
//     outbox flush and the tenant slot repair.
//
// What it does not do: decide what a woken job does (its actor and decision
// core, packages jobactor and lifecycle: a wake for a job that needs
// nothing changes nothing); route messages or keep actors (packages intake
// and supervisor); renew locks, leases or the node's own lease, or run the
// scripts that read and push back the due, lease and parked sets (package
// store). It wakes jobs at a bounded rate, PerShard per shard per tick, and
// each entry it takes is pushed back DueRetryAfter, so a wake that did not
// take is not repeated every tick.
package recovery
