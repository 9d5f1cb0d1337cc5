package troupe

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/ratelimit"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/proto/capv1"
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

	// keys keeps a parsed file's concurrency_keys (README, "Concurrency
	// keys"); read when the node starts.
	keys map[string]router.KeyLimit

	// retries keeps a parsed file's retry policies per topic (pools.yaml
	// key retries; README, "Retries").
	retries map[string]jobstate.RetryPolicy

	// rates are the pools.yaml's rate limit buckets (section rate_limits;
	// nil: none), read when the node starts.
	rates *ratelimit.Spec
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
	rates, err := ratelimit.Parse(yaml)
	if err != nil {
		return nil, err
	}
	p := poolsFrom(pc)
	p.rates = rates
	return p, nil
}

// poolsFrom is the public form of a parsed routing config.
func poolsFrom(pc *router.PoolConfig) *Pools {
	p := &Pools{Topics: pc.Topics, Pools: make(map[string]Pool, len(pc.Pools)), keys: pc.Keys,
		retries: pc.Retries}
	for name, rp := range pc.Pools {
		p.Pools[name] = Pool{Requires: rp.Requires, Dispatch: string(rp.Dispatch), overload: rp.Overload}
	}
	return p
}

// routing is the router's form of p (a fresh value: the router and the
// pools watcher share it; the caller's maps are copied).
func (p *Pools) routing() *router.PoolConfig {
	pc := &router.PoolConfig{Topics: make(map[string][]string, len(p.Topics)), Pools: make(map[string]router.Pool, len(p.Pools)),
		Keys: p.keys, Retries: maps.Clone(p.retries)}
	for t, ps := range p.Topics {
		pc.Topics[t] = slices.Clone(ps)
	}
	for name, pl := range p.Pools {
		pc.Pools[name] = router.Pool{Requires: slices.Clone(pl.Requires), Dispatch: router.DispatchMode(pl.Dispatch),
			Overload: pl.overload}
	}
	return pc
}

// poolsReload is what a pools reload (the pools file changed, SIGHUP,
// Node.ReloadPools) changes beside the router's routing: the retry
// policies and concurrency key limits the job core reads on each use, and
// the rate limit buckets. The core's functions read cur, so a reload needs
// no new core config; a job keeps the retry policy it read when it started.
type poolsReload struct {
	cur atomic.Pointer[poolsNow]
	// mu orders Apply on the limiter with its creation (ratesPart) and
	// guards what follows. spec is the last pools file's buckets (a node
	// built from Config.Pools keeps its own), poolsKeys its concurrency
	// keys; policyRates and policyKeys the policy file's (policy_limits.go);
	// applied the buckets last given to the limiter.
	mu          sync.Mutex
	spec        *ratelimit.Spec
	poolsKeys   map[string]router.KeyLimit
	policyRates *ratelimit.Spec
	policyKeys  map[string]router.KeyLimit
	applied     *ratelimit.Spec
}

type poolsNow struct {
	retry    func(*capv1.JobRequest) jobstate.RetryPolicy
	keyLimit func(string) (int, string)
}

// poolsApplied is the pools watcher's OnApply: every config it loads or
// applies, with the file's rate limit buckets (extra).
func (n *Node) poolsApplied(cfg *router.PoolConfig, extra any) {
	n.reload.mu.Lock()
	defer n.reload.mu.Unlock()
	n.reload.poolsKeys = cfg.Keys
	if n.poolsFromFile {
		n.reload.spec, _ = extra.(*ratelimit.Spec)
	}
	n.applyLimitsLocked(retryPolicies(cfg.Retries), "pools reload")
}

// poolsExtra is the pools watcher's Extra: a pools file's buckets, refused
// (the whole file) when they or its keys conflict with the policy file's.
func (n *Node) poolsExtra(data []byte) (any, error) {
	spec, err := ratelimit.Parse(data)
	if err != nil {
		return nil, err
	}
	keys, err := router.ParseKeys(data)
	if err != nil {
		return nil, err
	}
	n.reload.mu.Lock()
	defer n.reload.mu.Unlock()
	if err := checkLimits(spec, n.reload.policyRates, keys, n.reload.policyKeys); err != nil {
		return nil, err
	}
	return spec, nil
}

// rateSpec is the buckets the limiter starts with.
func (n *Node) rateSpec() *ratelimit.Spec {
	spec := n.rateSpecLocked()
	n.reload.applied = spec
	return spec
}

// retryPolicy is the job core's Config.Retry: the policy of the pools in
// force.
func (n *Node) retryPolicy(req *capv1.JobRequest) jobstate.RetryPolicy {
	if c := n.reload.cur.Load(); c != nil {
		return c.retry(req)
	}
	return retryPolicies(n.cfg.routing.Retries)(req)
}

// keyLimitNow is the job core's Config.KeyLimit: the limits of the pools and
// policy in force. nil (keys ignored) when the node started without
// concurrency_keys in either:
// their slots and wakes start with the node, so keys a reload adds need a
// restart.
func (n *Node) keyLimitNow() func(string) (int, string) {
	if !n.keysOn {
		return nil
	}
	return func(key string) (int, string) {
		c := n.reload.cur.Load()
		if c == nil || c.keyLimit == nil {
			return 0, "" // a reload removed every key's limit
		}
		return c.keyLimit(key)
	}
}
