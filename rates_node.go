package troupe

import (
	"context"

	"github.com/troupe-run/troupe/internal/ratelimit"
)

// ratesPart runs the node's rate limit buckets (section rate_limits of
// pools.yaml and of the policy file; README, "Rate limits"): one goroutine
// a declared bucket (and a template's live key bucket), idle while no job
// of this node waits on it. A pools reload (poolsApplied) or a policy
// reload (policyApplied, bound here to the built-in engine) applies the
// files' buckets to it. The admin API finds the
// limiter by the node's id (ratelimit.Lookup).
func (n *Node) ratesPart() part {
	return part{name: "rate-limits",
		start: func(ctx context.Context) error {
			m, err := ratelimit.NewMetrics(n.cfg.Metrics)
			if err != nil {
				return err
			}
			// Under the reload's lock: a reload from now on reaches this limiter.
			n.reload.mu.Lock()
			n.rates = ratelimit.New(ratelimit.Config{Spec: n.rateSpec(), Store: ratelimit.NewStore(n.rdb, n.cfg.KeyPrefix),
				NodeID: n.cfg.NodeID, Log: n.log, Metrics: m})
			n.reload.mu.Unlock()
			ratelimit.Register(n.cfg.NodeID, n.rates)
			if err := n.rates.Start(ctx); err != nil {
				return err
			}
			// A policy reload applies the policy file's limits from now on;
			// one that came between NewNode and here is applied now.
			if e := n.policyEngine(); e != nil {
				n.unbindPolicy = e.Bind(n.checkPolicy, n.policyApplied)
				n.policyApplied(e.Policy())
			}
			return nil
		},
		stop: func(ctx context.Context) error {
			if n.unbindPolicy != nil {
				n.unbindPolicy()
			}
			ratelimit.Unregister(n.cfg.NodeID, n.rates)
			return n.rates.Stop(ctx)
		}}
}
