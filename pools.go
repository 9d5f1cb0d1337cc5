package troupe

import "github.com/troupe-run/troupe/internal/router"

// Pool names of DefaultPools.
const (
	// PoolDefault takes the demo topics job.echo and job.sleep.
	PoolDefault = "default"
	// PoolBench takes job.bench, the topic of the benchmark (cmd/troupe-bench).
	PoolBench = "bench"
)

// DefaultPools is the routing a node uses when its Config has neither
// Pools nor PoolsFile, the same as `troupe node` and `troupe dev` without
// --pools: job.echo and job.sleep to pool "default", job.bench to pool
// "bench", neither pool requiring anything. Each call returns a fresh
// value, so a caller may add topics before handing it to a node:
//
//	pools := troupe.DefaultPools()
//	pools.Topics["job.summarize"] = []string{"llm"}
//	node, err := troupe.NewNode(troupe.Config{Pools: pools})
func DefaultPools() *router.PoolConfig {
	return &router.PoolConfig{
		Topics: map[string][]string{
			"job.echo":  {PoolDefault},
			"job.sleep": {PoolDefault},
			"job.bench": {PoolBench},
		},
		Pools: map[string]router.Pool{
			PoolDefault: {Dispatch: router.DispatchAuto},
			PoolBench:   {Dispatch: router.DispatchAuto},
		},
	}
}
