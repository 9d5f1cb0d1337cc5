// Package ratelimit keeps token buckets shared by every replica through
// Redis, and hands their tokens to the node's waiting jobs in order.
//
// Files, one duty each:
//   - spec.go: the declared buckets (pools.yaml section rate_limits) and
//     which bucket and how many units a job takes (meta.labels, or its
//     topic's binding).
//   - bucket.go: the bucket's Redis script (one hash-tagged key a bucket)
//     and the store that runs it.
//   - limiter.go: the node's component: per bucket, a FIFO queue of the
//     node's waiting jobs and one goroutine that takes tokens for all of
//     them in one script call per refill, so Redis commands follow buckets
//     and replicas, never waiting jobs.
//   - metrics.go: its Prometheus metrics.
//
// The package decides nothing about a job's life: the job's core
// (internal/lifecycle, ratewait.go) asks for tokens before it asks the
// router for a worker, and says what a wait, a grant and a deadline mean.
package ratelimit
