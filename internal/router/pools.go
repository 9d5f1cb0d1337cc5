// Package router decides where a job goes: it owns the pool routing config
// (pools.yaml, its watcher and the runtime mappings in Redis), the placement
// rules and the classification of the reason codes routing can fail with,
// and runs as one actor that owns the worker registry.
package router

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
)

// DispatchMode says how jobs reach a pool's workers.
type DispatchMode string

const (
	// DispatchAuto sends to worker.<id>.jobs when the chosen worker announces
	// it listens there (heartbeat label troupe.dispatch=direct), and to the
	// pool subject otherwise. The default.
	DispatchAuto DispatchMode = "auto"
	// DispatchPool always publishes to the pool subject.
	DispatchPool DispatchMode = "pool"
	// DispatchDirect always publishes to the chosen worker's direct subject.
	DispatchDirect DispatchMode = "direct"
)

// Pool is one pool's settings.
type Pool struct {
	// Requires lists what the pool provides; a job's meta.requires must be a
	// subset (case-insensitive).
	Requires []string
	// Dispatch is Troupe's addition (optional key `dispatch`): auto, pool or
	// direct.
	Dispatch DispatchMode
	// Overload is Troupe's addition (optional key `overload`, with
	// active_ratio, cpu_load, gpu_utilization): when a worker of this pool
	// counts as overloaded. Zero fields keep CAP's 0.9 / 90 / 90.
	Overload registry.Thresholds
}

// PoolConfig is pools.yaml: topic → pools, and the pools. Treat a
// PoolConfig as immutable once built: the router and the watcher share it.
type PoolConfig struct {
	Topics map[string][]string
	Pools  map[string]Pool
	// Paused are the topics whose jobs are not dispatched (pause.go).
	Paused map[string]bool
	// Keys are the concurrency keys' limits (pools.yaml concurrency_keys;
	// "*" applies to every key without its own entry).
	Keys map[string]KeyLimit
	// Retries are the topics' retry policies (key retries, retries.go).
	Retries map[string]jobstate.RetryPolicy
}

// KeyLimit is one concurrency key's limit and strategy (queue,
// cancel_newest or cancel_in_progress).
type KeyLimit struct {
	Limit    int
	Strategy string
}

// ErrInvalidPools wraps every pools.yaml validation error.
var ErrInvalidPools = errors.New("invalid pools config")

// PoolsError is a pools.yaml error at a line (0 when the line is unknown).
type PoolsError struct {
	Line int
	Msg  string
}

func (e *PoolsError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s: line %d: %s", ErrInvalidPools, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", ErrInvalidPools, e.Msg)
}

// Is makes errors.Is(err, ErrInvalidPools) hold.
func (e *PoolsError) Is(target error) bool { return target == ErrInvalidPools }

func poolsErr(n *yaml.Node, format string, args ...any) *PoolsError {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &PoolsError{Line: line, Msg: fmt.Sprintf(format, args...)}
}

// ParsePools parses and validates pools.yaml content: the format existing
// CAP deployments use (topics: name → pool or [pools]; pools: name →
// {requires}), plus Troupe's optional pool keys dispatch and overload.
// Unknown and duplicate keys are rejected, and every error names its line.
func ParsePools(data []byte) (*PoolConfig, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		line := yamlErrLine(err)
		// yaml.v3 already starts its message with "line N: "; say it once.
		msg = strings.TrimPrefix(msg, fmt.Sprintf("line %d: ", line))
		return nil, &PoolsError{Line: line, Msg: msg}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, &PoolsError{Line: 1, Msg: "topics: at least one topic mapping is required"}
	}
	root := resolve(doc.Content[0])
	if root.Kind != yaml.MappingNode {
		return nil, poolsErr(root, "the file must be a mapping with topics and pools")
	}
	var topicsNode, poolsNode, keysNode, retriesNode *yaml.Node
	err := eachKey(root, "", func(k, v *yaml.Node) error {
		switch k.Value {
		case "topics":
			topicsNode = v
		case "pools":
			poolsNode = v
		case "concurrency_keys":
			keysNode = v
		case "retries":
			retriesNode = v
		case "rate_limits":
			// Parsed by internal/ratelimit (the node reads it at start).
		default:
			return poolsErr(k, "unknown key %q (allowed: topics, pools, concurrency_keys, retries, rate_limits)", k.Value)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	cfg := &PoolConfig{Topics: map[string][]string{}, Pools: map[string]Pool{}}
	if retriesNode != nil {
		if err := parseRetries(retriesNode, cfg); err != nil {
			return nil, err
		}
	}
	if poolsNode != nil {
		if err := parsePoolsSection(poolsNode, cfg); err != nil {
			return nil, err
		}
	}
	if keysNode != nil {
		if err := parseKeysSection(keysNode, cfg); err != nil {
			return nil, err
		}
	}
	if topicsNode == nil || resolve(topicsNode).Kind != yaml.MappingNode || len(resolve(topicsNode).Content) == 0 {
		line := root
		if topicsNode != nil {
			line = topicsNode
		}
		return nil, poolsErr(line, "topics: at least one topic mapping is required")
	}
	err = eachKey(resolve(topicsNode), "topics", func(k, v *yaml.Node) error {
		pools, err := topicPools(k, v)
		if err != nil {
			return err
		}
		for _, p := range pools {
			if _, ok := cfg.Pools[p]; !ok {
				// A pool named only in topics has no requirements.
				cfg.Pools[p] = Pool{Dispatch: DispatchAuto}
			}
		}
		cfg.Topics[k.Value] = pools
		return nil
	})
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// ParseKeys reads only the concurrency_keys section of a YAML document
// (a policy file that declares key limits; README, "Concurrency keys"):
// nil without one. Its errors name their line.
func ParseKeys(data []byte) (map[string]KeyLimit, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &PoolsError{Line: yamlErrLine(err), Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if len(doc.Content) == 0 || resolve(doc.Content[0]).Kind != yaml.MappingNode {
		return nil, nil
	}
	root := resolve(doc.Content[0])
	cfg := &PoolConfig{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "concurrency_keys" {
			if err := parseKeysSection(root.Content[i+1], cfg); err != nil {
				return nil, err
			}
		}
	}
	return cfg.Keys, nil
}

// parseKeysSection reads concurrency_keys: a mapping of key ("*": every
// other key) to {limit: N, strategy: queue|cancel_newest|cancel_in_progress}.
func parseKeysSection(n *yaml.Node, cfg *PoolConfig) error {
	n = resolve(n)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return poolsErr(n, "concurrency_keys must be a mapping of key to {limit, strategy}")
	}
	cfg.Keys = map[string]KeyLimit{}
	return eachKey(n, "concurrency_keys", func(k, v *yaml.Node) error {
		if k.Value == "" || len(k.Value) > 128 {
			return poolsErr(k, "concurrency_keys: a key must have 1 to 128 bytes")
		}
		var kl struct {
			Limit    *int   `yaml:"limit"`
			Strategy string `yaml:"strategy"`
		}
		if err := resolve(v).Decode(&kl); err != nil || kl.Limit == nil || *kl.Limit < 0 {
			return poolsErr(v, "concurrency_keys.%s must be {limit: N ≥ 0, strategy: queue|cancel_newest|cancel_in_progress}", k.Value)
		}
		switch kl.Strategy {
		case "", "queue", "cancel_newest", "cancel_in_progress":
		default:
			return poolsErr(v, "concurrency_keys.%s.strategy: %q is not queue, cancel_newest or cancel_in_progress", k.Value, kl.Strategy)
		}
		if kl.Strategy == "" {
			kl.Strategy = "queue"
		}
		cfg.Keys[k.Value] = KeyLimit{Limit: *kl.Limit, Strategy: kl.Strategy}
		return nil
	})
}

func parsePoolsSection(n *yaml.Node, cfg *PoolConfig) error {
	n = resolve(n)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return poolsErr(n, "pools must be a mapping of pool name to settings")
	}
	return eachKey(n, "pools", func(k, v *yaml.Node) error {
		p, err := parsePool(k.Value, v)
		if err != nil {
			return err
		}
		cfg.Pools[k.Value] = p
		return nil
	})
}

func parsePool(name string, n *yaml.Node) (Pool, error) {
	p := Pool{Dispatch: DispatchAuto}
	n = resolve(n)
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return p, nil
	}
	if n.Kind != yaml.MappingNode {
		return p, poolsErr(n, "pools.%s must be a mapping (requires, dispatch, overload)", name)
	}
	err := eachKey(n, "pools."+name, func(k, v *yaml.Node) error {
		switch k.Value {
		case "requires":
			if err := v.Decode(&p.Requires); err != nil {
				return poolsErr(v, "pools.%s.requires must be a list of strings", name)
			}
		case "dispatch":
			var d string
			if err := v.Decode(&d); err != nil {
				return poolsErr(v, "pools.%s.dispatch must be a string", name)
			}
			switch DispatchMode(d) {
			case "":
			case DispatchAuto, DispatchPool, DispatchDirect:
				p.Dispatch = DispatchMode(d)
			default:
				return poolsErr(v, "pools.%s.dispatch: %q is not auto, pool or direct", name, d)
			}
		case "overload":
			th, err := parseOverload(name, v)
			if err != nil {
				return err
			}
			p.Overload = th
		default:
			return poolsErr(k, "pools.%s: unknown key %q (allowed: requires, dispatch, overload)", name, k.Value)
		}
		return nil
	})
	return p, err
}

func parseOverload(pool string, n *yaml.Node) (registry.Thresholds, error) {
	var th registry.Thresholds
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		return th, poolsErr(n, "pools.%s.overload must be a mapping (active_ratio, cpu_load, gpu_utilization)", pool)
	}
	err := eachKey(n, "pools."+pool+".overload", func(k, v *yaml.Node) error {
		var f float64
		if err := v.Decode(&f); err != nil {
			return poolsErr(v, "pools.%s.overload.%s must be a number", pool, k.Value)
		}
		switch k.Value {
		case "active_ratio":
			if f <= 0 || f > 1 {
				return poolsErr(v, "pools.%s.overload.active_ratio: %v is not in (0, 1]", pool, f)
			}
			th.ActiveRatio = f
		case "cpu_load", "gpu_utilization":
			if f <= 0 || f > 100 {
				return poolsErr(v, "pools.%s.overload.%s: %v is not a percentage in (0, 100]", pool, k.Value, f)
			}
			if k.Value == "cpu_load" {
				th.CPULoad = float32(f)
			} else {
				th.GPUUtil = float32(f)
			}
		default:
			return poolsErr(k, "pools.%s.overload: unknown key %q (allowed: active_ratio, cpu_load, gpu_utilization)",
				pool, k.Value)
		}
		return nil
	})
	return th, err
}

// topicPools reads a topic's value: one pool name or a list of them.
func topicPools(k, v *yaml.Node) ([]string, error) {
	if k.Value == "" {
		return nil, poolsErr(k, "topics: empty topic name")
	}
	v = resolve(v)
	var pools []string
	switch {
	case v.Kind == yaml.ScalarNode && v.Tag != "!!null":
		pools = []string{v.Value}
	case v.Kind == yaml.SequenceNode:
		for _, e := range v.Content {
			e = resolve(e)
			if e.Kind != yaml.ScalarNode || e.Tag == "!!null" {
				return nil, poolsErr(e, "topics.%s: pool names must be strings", k.Value)
			}
			pools = append(pools, e.Value)
		}
	case v.Kind == yaml.ScalarNode || v.Kind == yaml.MappingNode:
		return nil, poolsErr(v, "topics.%s: value must be a pool name or a list of pool names", k.Value)
	}
	if len(pools) == 0 {
		return nil, poolsErr(v, "topics.%s: needs at least one pool", k.Value)
	}
	for _, p := range pools {
		if p == "" {
			return nil, poolsErr(v, "topics.%s: empty pool name", k.Value)
		}
	}
	return pools, nil
}

// eachKey walks a mapping's pairs, rejecting duplicate and non-scalar keys
// (the decoder CAP deployments use rejects duplicates too).
func eachKey(m *yaml.Node, where string, fn func(k, v *yaml.Node) error) error {
	seen := make(map[string]int, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return poolsErr(k, "%s: keys must be strings", orTop(where))
		}
		if first, dup := seen[k.Value]; dup {
			return poolsErr(k, "%s: key %q already defined at line %d", orTop(where), k.Value, first)
		}
		seen[k.Value] = k.Line
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}

func orTop(where string) string {
	if where == "" {
		return "top level"
	}
	return where
}

func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// yamlErrLine digs the line out of a yaml.v3 syntax error ("yaml: line 3:
// ..."), which carries it only in its text.
func yamlErrLine(err error) int {
	s := err.Error()
	i := strings.Index(s, "line ")
	if i < 0 {
		return 0
	}
	s = s[i+len("line "):]
	j := 0
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	n, _ := strconv.Atoi(s[:j])
	return n
}

// LoadPools reads and parses a pools.yaml file.
func LoadPools(path string) (*PoolConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pools: %w", err)
	}
	cfg, err := ParsePools(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// TopicNames returns the mapped topics, sorted.
func (c *PoolConfig) TopicNames() []string {
	out := make([]string, 0, len(c.Topics))
	for t := range c.Topics {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// WithMappings returns a copy of c with runtime topic → pools mappings laid
// over it: a runtime mapping replaces the file's mapping for its topic, and
// a pool named only at runtime has no requirements. c is not modified.
func (c *PoolConfig) WithMappings(m map[string][]string) *PoolConfig {
	out := &PoolConfig{Topics: make(map[string][]string, len(c.Topics)+len(m)), Pools: make(map[string]Pool, len(c.Pools)),
		Keys: c.Keys, Retries: c.Retries}
	for t, ps := range c.Topics {
		out.Topics[t] = ps
	}
	for name, p := range c.Pools {
		out.Pools[name] = p
	}
	for t, ps := range m {
		if t == "" || len(ps) == 0 {
			continue
		}
		out.Topics[t] = append([]string(nil), ps...)
		for _, p := range ps {
			if _, ok := out.Pools[p]; !ok {
				out.Pools[p] = Pool{Dispatch: DispatchAuto}
			}
		}
	}
	return out
}

// thresholds returns the pools' overload thresholds for the registry.
func (c *PoolConfig) thresholds() map[string]registry.Thresholds {
	out := make(map[string]registry.Thresholds, len(c.Pools))
	for name, p := range c.Pools {
		if p.Overload != (registry.Thresholds{}) {
			out[name] = p.Overload
		}
	}
	return out
}

// providesAll reports whether have ⊇ want, case-insensitively.
func providesAll(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if strings.EqualFold(h, w) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
