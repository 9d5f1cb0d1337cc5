package router

import (
	"strconv"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// parseRetries reads pools.yaml's retries section: each topic's retry
// policy (jobstate.RetryPolicy), e.g.
//
//	retries:
//	  job.flaky: {attempts: 5, backoff_min: 100ms, backoff_max: 1s}
//
// A job's meta.labels may override its topic's (jobstate.RetryPolicyOf).
func parseRetries(n *yaml.Node, cfg *PoolConfig) error {
	n = resolve(n)
	if n.Kind != yaml.MappingNode {
		return poolsErr(n, "retries: must map topics to {attempts, backoff_min, backoff_max}")
	}
	cfg.Retries = map[string]jobstate.RetryPolicy{}
	return eachKey(n, "retries", func(k, v *yaml.Node) error {
		if k.Value == "" {
			return poolsErr(k, "retries: empty topic name")
		}
		v = resolve(v)
		if v.Kind != yaml.MappingNode {
			return poolsErr(v, "retries.%s: must be a mapping with attempts, backoff_min, backoff_max", k.Value)
		}
		var p jobstate.RetryPolicy
		err := eachKey(v, "retries."+k.Value, func(fk, fv *yaml.Node) error {
			fv = resolve(fv)
			switch fk.Value {
			case "attempts":
				a, err := strconv.Atoi(fv.Value)
				if err != nil {
					return poolsErr(fv, "retries.%s.attempts: %q is not a number", k.Value, fv.Value)
				}
				p.MaxAttempts = a
			case "backoff_min", "backoff_max":
				d, err := time.ParseDuration(fv.Value)
				if err != nil {
					return poolsErr(fv, "retries.%s.%s: %q is not a duration (100ms, 1s)", k.Value, fk.Value, fv.Value)
				}
				if fk.Value == "backoff_min" {
					p.BackoffMin = d
				} else {
					p.BackoffMax = d
				}
			default:
				return poolsErr(fk, "retries.%s: unknown key %q (allowed: attempts, backoff_min, backoff_max)", k.Value, fk.Value)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if err := p.Validate(); err != nil {
			return poolsErr(v, "retries.%s: %v", k.Value, err)
		}
		cfg.Retries[k.Value] = p
		return nil
	})
}
