package policyx

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/proto/capv1"
)

// decisionCacheSizeDefault bounds the decision cache: at ~1 KiB an entry,
// 10k entries are ~10 MiB, and a node that sees more distinct jobs than
// that within one TTL gains little from caching anyway.
const decisionCacheSizeDefault = 10_000

// hashCheckRequest is the decision cache's key: sha256 of the deterministic
// protobuf encoding of req without job_id and the cordum.bus_msg_id label.
// It is HashJobRequest's counterpart for a PolicyCheckRequest, with two
// differences that make it a sound cache key: the job id is left out (no
// rule can match on it, so identical jobs share a decision; approval_ref is
// rewritten on a hit), and the approval_* labels and the effective config
// stay in (a rule may match on them).
func hashCheckRequest(req *capv1.PolicyCheckRequest) string {
	c := proto.Clone(req).(*capv1.PolicyCheckRequest)
	c.JobId = ""
	if _, ok := c.Labels["cordum.bus_msg_id"]; ok {
		delete(c.Labels, "cordum.bus_msg_id")
	}
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// decisionCache holds kernel decisions for a TTL. Safe for concurrent use.
type decisionCache struct {
	ttl time.Duration
	max int

	mu      sync.Mutex
	entries map[string]cacheEntry
}

type cacheEntry struct {
	resp    *capv1.PolicyCheckResponse
	expires time.Time
}

func newDecisionCache(ttl time.Duration, size int) *decisionCache {
	if size <= 0 {
		size = decisionCacheSizeDefault
	}
	return &decisionCache{ttl: ttl, max: size, entries: map[string]cacheEntry{}}
}

// get returns a copy of the cached decision for key, with approval_ref set
// for jobID.
func (c *decisionCache) get(key, jobID string, now time.Time) *capv1.PolicyCheckResponse {
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && !now.Before(e.expires) {
		delete(c.entries, key)
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return nil
	}
	r := proto.Clone(e.resp).(*capv1.PolicyCheckResponse)
	if r.ApprovalRequired {
		r.ApprovalRef = jobID
	}
	return r
}

// put caches resp. THROTTLE is never cached: it says "not now", and the
// retry must ask again.
func (c *decisionCache) put(key string, resp *capv1.PolicyCheckResponse, now time.Time) {
	if resp.GetDecision() == capv1.DecisionType_DECISION_TYPE_THROTTLE {
		return
	}
	r := proto.Clone(resp).(*capv1.PolicyCheckResponse)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) >= c.max {
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			}
		}
		// Still full: drop arbitrary entries (map order) rather than
		// refuse new ones; a cache is allowed to forget.
		for k := range c.entries {
			if len(c.entries) < c.max {
				break
			}
			delete(c.entries, k)
		}
	}
	c.entries[key] = cacheEntry{resp: r, expires: now.Add(c.ttl)}
}
