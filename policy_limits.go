package troupe

import (
	"fmt"
	"maps"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/ratelimit"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// Limits declared in the policy file (README, "Rate limits" and
// "Concurrency keys"): a built-in engine's policy (Config.Policy a
// *safety.Engine) may declare rate_limits and concurrency_keys in the
// pools file's format. They are merged with the pools file's: the union,
// where a bucket, template or key both declare must be declared alike and
// a topic is bound to one bucket only. A conflict is a load error: NewNode
// fails; a policy reload that would conflict is refused whole (the policy
// in force stays, Engine.Reload says why); so is a pools reload. Within
// the union a key's own entry wins over "*", whichever file holds either.

// policyLimits parses p's limits sections (nil, nil without any).
func policyLimits(p *safety.Policy) (*ratelimit.Spec, map[string]router.KeyLimit, error) {
	if p == nil || p.Limits() == nil {
		return nil, nil, nil
	}
	rates, err := ratelimit.Parse(p.Limits())
	if err != nil {
		return nil, nil, fmt.Errorf("policy file: %w", err)
	}
	keys, err := router.ParseKeys(p.Limits())
	if err != nil {
		return nil, nil, fmt.Errorf("policy file: %w", err)
	}
	return rates, keys, nil
}

// mergeKeys is the union of the pools file's and the policy file's
// concurrency keys; a key both declare differently is a conflict.
func mergeKeys(pools, policy map[string]router.KeyLimit) (map[string]router.KeyLimit, error) {
	if len(policy) == 0 {
		return pools, nil
	}
	if len(pools) == 0 {
		return policy, nil
	}
	out := maps.Clone(pools)
	for k, v := range policy {
		if o, ok := out[k]; ok && o != v {
			return nil, fmt.Errorf("concurrency_keys: key %q is declared in both the pools file (limit %d, %s) and the policy file (limit %d, %s)",
				k, o.Limit, o.Strategy, v.Limit, v.Strategy)
		}
		out[k] = v
	}
	return out, nil
}

// policyEngine is the built-in engine whose policy may declare limits
// (nil: the node's policy is another kind).
func (n *Node) policyEngine() *safety.Engine {
	e, _ := n.cfg.Policy.(*safety.Engine)
	return e
}

// poolsRatesLocked is the pools' buckets in force (n.reload.mu held).
func (n *Node) poolsRatesLocked() *ratelimit.Spec {
	if n.poolsFromFile {
		return n.reload.spec
	}
	return n.cfg.rates
}

// checkLimits reports whether the pools' limits (rates, keys) and the
// policy's merge (n.reload.mu held).
func checkLimits(poolsRates, policyRates *ratelimit.Spec, poolsKeys, policyKeys map[string]router.KeyLimit) error {
	if _, err := ratelimit.Merge(poolsRates, policyRates); err != nil {
		return fmt.Errorf("limits of the pools and policy files conflict: %w", err)
	}
	if _, err := mergeKeys(poolsKeys, policyKeys); err != nil {
		return fmt.Errorf("limits of the pools and policy files conflict: %w", err)
	}
	return nil
}

// checkPolicy is the engine's check before a policy reload: the new file's
// limits parse and merge with the pools' in force.
func (n *Node) checkPolicy(p *safety.Policy) error {
	rates, keys, err := policyLimits(p)
	if err != nil {
		return err
	}
	n.reload.mu.Lock()
	defer n.reload.mu.Unlock()
	return checkLimits(n.poolsRatesLocked(), rates, n.reload.poolsKeys, keys)
}

// policyApplied applies a reloaded policy's limits as a pools reload does.
func (n *Node) policyApplied(p *safety.Policy) {
	rates, keys, err := policyLimits(p)
	if err != nil { // checked before the engine took it; a version from before the bind
		n.log.Error("policy file's limits not applied", "err", err)
		return
	}
	n.reload.mu.Lock()
	defer n.reload.mu.Unlock()
	if err := checkLimits(n.poolsRatesLocked(), rates, n.reload.poolsKeys, keys); err != nil {
		n.log.Error("policy file's limits not applied", "err", err)
		return
	}
	n.reload.policyRates, n.reload.policyKeys = rates, keys
	n.applyLimitsLocked(nil, "policy reload")
}

// applyLimitsLocked puts the merged limits in force: the core's key limits
// (with retry, the pools' retry policies; nil: those in force) and the
// limiter's buckets (n.reload.mu held).
func (n *Node) applyLimitsLocked(retry func(*capv1.JobRequest) jobstate.RetryPolicy, why string) {
	if retry == nil {
		if c := n.reload.cur.Load(); c != nil {
			retry = c.retry
		} else {
			retry = retryPolicies(n.cfg.routing.Retries)
		}
	}
	keys, err := mergeKeys(n.reload.poolsKeys, n.reload.policyKeys)
	if err != nil { // refused before; kept safe
		n.log.Error(why+": concurrency key limits conflict; the pools file's apply", "err", err)
		keys = n.reload.poolsKeys
	}
	n.reload.cur.Store(&poolsNow{retry: retry, keyLimit: keyLimit(keys)})
	spec := n.rateSpecLocked()
	if spec == n.reload.applied {
		return
	}
	n.reload.applied = spec
	if n.rates != nil {
		if told := n.rates.Apply(spec); told > 0 {
			n.log.Warn(why+": jobs waiting on removed or narrowed rate limit buckets fail rate_limit_invalid",
				"jobs", told)
		}
		n.log.Info(why+": rate limit buckets applied", "buckets", len(spec.Names()),
			"templates", len(specTemplates(spec)))
	}
}

func specTemplates(s *ratelimit.Spec) map[string]*ratelimit.Bucket {
	if s == nil {
		return nil
	}
	return s.Templates
}

// rateSpecLocked is the buckets in force: the pools' merged with the
// policy's (n.reload.mu held).
func (n *Node) rateSpecLocked() *ratelimit.Spec {
	spec, err := ratelimit.Merge(n.poolsRatesLocked(), n.reload.policyRates)
	if err != nil { // refused before; kept safe
		n.log.Error("rate limit buckets conflict; the pools file's apply", "err", err)
		return n.poolsRatesLocked()
	}
	return spec
}
