// Package router decides where a job goes: it owns the pool routing config
// (pools.yaml), the placement rules and the reason codes routing can fail
// with, and runs as one actor that owns the worker registry.
package router

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
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
	Requires []string `yaml:"requires"`
	// Dispatch is Troupe's addition (optional): auto, pool or direct.
	Dispatch DispatchMode `yaml:"dispatch,omitempty"`
}

// PoolConfig is pools.yaml: topic → pools, and the pools.
type PoolConfig struct {
	Topics map[string][]string
	Pools  map[string]Pool
}

// topicPools accepts a single pool name or a list.
type topicPools []string

func (t *topicPools) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*t = []string{n.Value}
		return nil
	case yaml.SequenceNode:
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		*t = l
		return nil
	}
	return fmt.Errorf("line %d: topic value must be a pool name or a list of pool names", n.Line)
}

type poolsFile struct {
	Topics map[string]topicPools `yaml:"topics"`
	Pools  map[string]Pool       `yaml:"pools"`
}

// ErrInvalidPools wraps every pools.yaml validation error.
var ErrInvalidPools = errors.New("invalid pools config")

// ParsePools parses and validates pools.yaml content. Unknown keys are
// rejected, and errors name the line.
func ParsePools(data []byte) (*PoolConfig, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f poolsFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidPools, err)
	}
	if len(f.Topics) == 0 {
		return nil, fmt.Errorf("%w: topics: at least one topic mapping is required", ErrInvalidPools)
	}
	cfg := &PoolConfig{Topics: map[string][]string{}, Pools: map[string]Pool{}}
	for name, p := range f.Pools {
		switch p.Dispatch {
		case "":
			p.Dispatch = DispatchAuto
		case DispatchAuto, DispatchPool, DispatchDirect:
		default:
			return nil, fmt.Errorf("%w: pools.%s.dispatch: %q is not auto, pool or direct", ErrInvalidPools, name, p.Dispatch)
		}
		cfg.Pools[name] = p
	}
	for topic, pools := range f.Topics {
		if topic == "" || len(pools) == 0 {
			return nil, fmt.Errorf("%w: topics.%s: needs at least one pool", ErrInvalidPools, topic)
		}
		for _, p := range pools {
			if p == "" {
				return nil, fmt.Errorf("%w: topics.%s: empty pool name", ErrInvalidPools, topic)
			}
			if _, ok := cfg.Pools[p]; !ok {
				// A pool named only in topics has no requirements.
				cfg.Pools[p] = Pool{Dispatch: DispatchAuto}
			}
		}
		cfg.Topics[topic] = append([]string(nil), pools...)
	}
	return cfg, nil
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
