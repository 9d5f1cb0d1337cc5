package troupe

import (
	"slices"

	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/router"
)

// Pool names of DefaultPools.
const (
	// PoolDefault takes the demo topics job.echo and job.sleep.
	PoolDefault = "default"
	// PoolBench takes job.bench, the topic of the benchmark (cmd/troupe-bench).
	PoolBench = "bench"
)

// Pools is a node's routing (Config.Pools), the content of a pools.yaml:
// each topic's pools, in order of preference, and each pool's
// requirements. Build it in Go (see DefaultPools) or parse it
// (ParsePools). Treat it as immutable once handed to a node.
type Pools struct {
	// Topics maps a job topic to the pools that may run it.
	Topics map[string][]string
	// Pools are the pools by name.
	Pools map[string]Pool
}

// Pool is one pool of Pools.
type Pool struct {
	// Requires lists what the pool's workers provide; a job's
	// meta.requires must be a subset (case-insensitive).
	Requires []string
	// Dispatch is how jobs reach the pool's workers: "auto" (the default:
	// to the chosen worker when it announces a direct subject, else to
	// the pool), "pool" or "direct".
	Dispatch string

	// overload keeps a parsed pool's overload thresholds (pools.yaml key
	// overload; zero: CAP's).
	overload registry.Thresholds
}

// DefaultPools is the routing a node uses when its Config has neither
// Pools nor PoolsFile, the same as `troupe node` and `troupe dev` without
// --pools: job.echo and job.sleep to pool "default", job.bench to pool
// "bench", neither pool requiring anything. Each call returns a fresh
// value, so a caller may add topics before handing it to a node:
//
//	pools := troupe.DefaultPools()
//	pools.Topics["job.summarize"] = []string{"llm"}
//	node, err := troupe.NewNode(troupe.Config{Pools: pools})
func DefaultPools() *Pools {
	return &Pools{
		Topics: map[string][]string{
			"job.echo":  {PoolDefault},
			"job.sleep": {PoolDefault},
			"job.bench": {PoolBench},
		},
		Pools: map[string]Pool{
			PoolDefault: {Dispatch: string(router.DispatchAuto)},
			PoolBench:   {Dispatch: string(router.DispatchAuto)},
		},
	}
}

// ParsePools parses a pools.yaml (the format of `troupe node --pools`;
// README, "Routing and capacity"). Its errors name their line.
func ParsePools(yaml []byte) (*Pools, error) {
	pc, err := router.ParsePools(yaml)
	if err != nil {
		return nil, err
	}
	return poolsFrom(pc), nil
}

// poolsFrom is the public form of a parsed routing config.
func poolsFrom(pc *router.PoolConfig) *Pools {
	p := &Pools{Topics: pc.Topics, Pools: make(map[string]Pool, len(pc.Pools))}
	for name, rp := range pc.Pools {
		p.Pools[name] = Pool{Requires: rp.Requires, Dispatch: string(rp.Dispatch), overload: rp.Overload}
	}
	return p
}

// routing is the router's form of p (a fresh value: the router and the
// pools watcher share it; the caller's maps are copied).
func (p *Pools) routing() *router.PoolConfig {
	pc := &router.PoolConfig{Topics: make(map[string][]string, len(p.Topics)), Pools: make(map[string]router.Pool, len(p.Pools))}
	for t, ps := range p.Topics {
		pc.Topics[t] = slices.Clone(ps)
	}
	for name, pl := range p.Pools {
		pc.Pools[name] = router.Pool{Requires: slices.Clone(pl.Requires), Dispatch: router.DispatchMode(pl.Dispatch),
			Overload: pl.overload}
	}
	return pc
}
