// Package policyx is the gRPC plumbing of the node's policies, which users
// of package safety do not call: the SafetyKernel client (kernel_client.go)
// behind a circuit breaker whose state replicas share in Redis
// (breaker.go), its decision cache (cache.go) and metrics (metrics.go); the
// kernel server of `troupe safety serve` (kernel_server.go); the remote
// output checker, the output policy server and the checker the
// OUTPUT_POLICY_* settings select (output_remote.go).
package policyx
