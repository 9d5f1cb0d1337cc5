package router

import (
	"math/rand/v2"
	"strings"
	"time"

	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/registry"
)

// Labels with a routing meaning of their own.
const (
	LabelPreferredPool   = "preferred_pool"
	LabelPreferredWorker = "preferred_worker_id"
)

// PlacementLabels returns the labels a worker must carry to take req:
// req.labels minus the ones that describe the job rather than constrain where
// it runs (CAP's exclusion list, plus Troupe's saga labels).
func PlacementLabels(labels map[string]string) map[string]string {
	var out map[string]string
	for k, v := range labels {
		if excludedFromPlacement(k) {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(labels))
		}
		out[k] = v
	}
	return out
}

func excludedFromPlacement(k string) bool {
	if strings.HasPrefix(k, "preferred_") || strings.HasPrefix(k, "cordum.") || strings.HasPrefix(k, "approval_") {
		return true
	}
	switch k {
	case "approval_granted", "secrets_present", "workflow_id", "run_id", "step_id", "node_id", "worker_id",
		"saga_compensation", "is_compensation", "saga_workflow_id":
		return true
	}
	return false
}

// Pick is a placement decision.
type Pick struct {
	Worker  *registry.Worker
	Subject string
	Reason  core.Reason // empty on success
	Detail  string
}

// Strategy places jobs on workers. It is owned by the router actor.
type Strategy struct {
	cfg  *PoolConfig
	reg  *registry.Registry
	subj func(workerID string) string
	pool func(topic string) string
	rnd  *rand.Rand
}

// NewStrategy returns a least-loaded strategy over reg.
func NewStrategy(cfg *PoolConfig, reg *registry.Registry, direct func(string) string, pool func(string) string) *Strategy {
	return &Strategy{cfg: cfg, reg: reg, subj: direct, pool: pool, rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
}

// SetConfig swaps the pool config.
func (s *Strategy) SetConfig(cfg *PoolConfig) { s.cfg = cfg }

// Config returns the pool config in use.
func (s *Strategy) Config() *PoolConfig { return s.cfg }

// Pick chooses a worker for req at now and counts the dispatch against it.
func (s *Strategy) Pick(req *capv1.JobRequest, now time.Time) Pick {
	pools, ok := s.cfg.Topics[req.Topic]
	if !ok {
		return Pick{Reason: core.ReasonTopicUnmapped, Detail: "no pool is mapped to topic " + req.Topic}
	}
	if pref := req.Labels[LabelPreferredPool]; pref != "" {
		found := false
		for _, p := range pools {
			if p == pref {
				found = true
				break
			}
		}
		if !found {
			return Pick{Reason: core.ReasonPreferredPoolUnmapped,
				Detail: "preferred pool " + pref + " is not mapped to topic " + req.Topic}
		}
		pools = []string{pref}
	}
	var requires []string
	if req.Meta != nil {
		requires = req.Meta.Requires
	}
	placement := PlacementLabels(req.Labels)
	prefWorker := req.Labels[LabelPreferredWorker]

	var (
		best       *registry.Worker
		bestPool   string
		bestScore  float64
		ties       int
		anyPool    bool
		candidates int
	)
	for _, p := range pools {
		pc := s.cfg.Pools[p]
		if !providesAll(pc.Requires, requires) {
			continue
		}
		anyPool = true
		for _, w := range s.reg.Pool(p) {
			if !s.reg.Live(w, now) || !w.HasLabels(placement) {
				continue
			}
			candidates++
			if w.Overloaded() {
				continue
			}
			if prefWorker != "" && w.ID == prefWorker {
				best, bestPool, ties = w, p, -1
				break
			}
			score := w.Load()
			switch {
			case best == nil || score < bestScore:
				best, bestPool, bestScore, ties = w, p, score, 1
			case score == bestScore:
				// Reservoir sampling: each of the tied workers is kept with equal probability.
				ties++
				if s.rnd.IntN(ties) == 0 {
					best, bestPool = w, p
				}
			}
		}
		if ties < 0 {
			break
		}
	}
	switch {
	case !anyPool:
		return Pick{Reason: core.ReasonRequiresUnsatisfied,
			Detail: "no pool of topic " + req.Topic + " provides " + strings.Join(requires, ",")}
	case best == nil && candidates == 0:
		return Pick{Reason: core.ReasonNoWorkers, Detail: "no live worker in pools " + strings.Join(pools, ",")}
	case best == nil:
		return Pick{Reason: core.ReasonPoolOverloaded, Detail: "every live worker is overloaded"}
	}
	best.Dispatched++
	return Pick{Worker: best, Subject: s.subjectFor(best, bestPool, req.Topic)}
}

func (s *Strategy) subjectFor(w *registry.Worker, pool, topic string) string {
	switch s.cfg.Pools[pool].Dispatch {
	case DispatchDirect:
		return s.subj(w.ID)
	case DispatchPool:
		return s.pool(topic)
	}
	if w.Direct {
		return s.subj(w.ID)
	}
	return s.pool(topic)
}
