package router

import (
	"strconv"
	"strings"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Labels with a routing meaning of their own.
const (
	LabelPreferredPool   = "preferred_pool"
	LabelPreferredWorker = "preferred_worker_id"
)

// Strategy defaults.
const (
	// StaleRetriesDefault is how many times a pick that lands on a stale
	// worker is re-picked before the router answers stale_worker. Three
	// covers a worker or two dying together without turning one pick into a
	// walk over a dead pool.
	StaleRetriesDefault = 3
)

// excludedFromPlacement reports whether a job label describes the job
// rather than constrains where it runs (CAP's exclusion list, plus Troupe's
// saga labels and retry_of).
func excludedFromPlacement(k string) bool {
	if strings.HasPrefix(k, "preferred_") || strings.HasPrefix(k, "cordum.") || strings.HasPrefix(k, "approval_") {
		return true
	}
	switch k {
	case "approval_granted", "secrets_present", "workflow_id", "run_id", "step_id", "node_id", "worker_id",
		"saga_compensation", "is_compensation", "saga_workflow_id", "retry_of":
		return true
	}
	return false
}

// isPlacementKey is the label filter the registry's selectors use.
func isPlacementKey(k string) bool { return !excludedFromPlacement(k) }

// hasPlacement reports whether labels hold any placement label (a label
// that constrains where the job runs, not one that describes it), without
// building a map (the pick path must not allocate).
func hasPlacement(labels map[string]string) bool {
	for k := range labels {
		if !excludedFromPlacement(k) {
			return true
		}
	}
	return false
}

// carries reports whether w carries every placement label of the job
// labels.
func carries(w *registry.Worker, labels map[string]string) bool {
	for k, v := range labels {
		if excludedFromPlacement(k) {
			continue
		}
		if got, ok := w.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Pick is a placement decision.
type Pick struct {
	Worker  *registry.Worker
	Subject string
	// Direct: Subject is the worker's own (worker.<id>.jobs), not the pool's.
	Direct bool
	Reason jobstate.Reason // empty on success
	Detail string
}

// route is a topic's resolved routing, built once per config.
type route struct {
	subject string // the topic's pool subject
	pools   []*poolRoute
}

type poolRoute struct {
	name     string
	requires []string
	dispatch DispatchMode
}

// Strategy places jobs on workers. It is owned by the router actor: every
// field, the scratch space included, is touched only on its goroutine.
//
// A pick reads the top of each candidate pool's placement index (O(1)),
// checks liveness there, and re-sorts the chosen worker after counting the
// dispatch (O(log n)); it does not allocate. A pick with placement labels
// reads the registry's index for that label set instead, which the first
// such pick builds with one scan of the pool.
type Strategy struct {
	cfg    *PoolConfig
	routes map[string]*route
	// routed: the pools some topic routes to.
	routed map[string]bool
	reg    *registry.Registry
	subj   func(workerID string) string
	pool   func(topic string) string

	staleRetries int
	// onStale is told about every pick that landed on a stale worker.
	onStale func(topic, workerID string)
	// onBlindDirect is told about a pick, in a pool forced to `dispatch:
	// direct`, of a worker that does not say it listens on its direct
	// subject (stock CAP workers listen on the pool subject only); the job
	// goes to the pool subject instead.
	onBlindDirect func(w *registry.Worker, pool string)

	// Scratch reused across picks: the candidate pools and, for a pick with
	// placement labels, their selectors (same order).
	cand []*poolRoute
	sels []registry.Selector
	// overPool and overDetail: the overloaded detail last said for a pick
	// with the one candidate pool overPool. At full speed nearly every job
	// waits for room with that detail: said once, not built per job.
	overPool, overDetail string
}

// NewStrategy returns a least-loaded strategy over reg. direct names a
// worker's direct subject and pool a topic's pool subject; nil means CAP's
// standard names.
func NewStrategy(cfg *PoolConfig, reg *registry.Registry, direct func(string) string, pool func(string) string) *Strategy {
	if direct == nil {
		direct = func(id string) string { return "worker." + id + ".jobs" }
	}
	if pool == nil {
		pool = func(topic string) string { return topic }
	}
	s := &Strategy{reg: reg, subj: direct, pool: pool, staleRetries: StaleRetriesDefault}
	s.SetConfig(cfg)
	return s
}

// SetConfig swaps the pool config (nil: no topic is mapped) and applies its
// overload thresholds to the registry.
func (s *Strategy) SetConfig(cfg *PoolConfig) {
	if cfg == nil {
		cfg = &PoolConfig{}
	}
	s.cfg = cfg
	s.routes = make(map[string]*route, len(cfg.Topics))
	s.routed = map[string]bool{}
	for _, names := range cfg.Topics {
		for _, n := range names {
			s.routed[n] = true
		}
	}
	for topic, names := range cfg.Topics {
		rt := &route{subject: s.pool(topic), pools: make([]*poolRoute, 0, len(names))}
		for _, name := range names {
			p, ok := cfg.Pools[name]
			if !ok {
				p = Pool{Dispatch: DispatchAuto}
			}
			rt.pools = append(rt.pools, &poolRoute{name: name, requires: p.Requires, dispatch: p.Dispatch})
		}
		s.routes[topic] = rt
	}
	s.reg.SetThresholds(cfg.thresholds())
}

// Routed reports whether some topic routes to pool. A worker of any other
// pool gets no jobs (often its heartbeat names a topic instead of a pool).
func (s *Strategy) Routed(pool string) bool { return s.routed[pool] }

// unroutedPools names the pools with workers that no topic routes to.
func (s *Strategy) unroutedPools() []string {
	var out []string
	for _, p := range s.reg.Pools() {
		if !s.routed[p] {
			out = append(out, p)
		}
	}
	return out
}

// Config returns the pool config in use.
func (s *Strategy) Config() *PoolConfig { return s.cfg }

// Pick chooses a worker for req at now and counts the dispatch against it.
//
// Order of rules: topic → pools; preferred_pool narrows to that pool;
// pools must provide meta.requires; a worker must carry the placement
// labels; preferred_worker_id wins when live and not overloaded; otherwise
// the lowest score, ties broken at random. A chosen worker past its
// liveness deadline is pulled out and re-picked, at most staleRetries times.
func (s *Strategy) Pick(req *capv1.JobRequest, now time.Time) Pick { return s.PickFor("", req, now) }

// PickFor is Pick for the job with id job: the slot it takes on the chosen
// worker is counted under its id (registry.Occupy), so the job's answer
// frees exactly that slot. An empty id counts the slot anonymously.
func (s *Strategy) PickFor(job string, req *capv1.JobRequest, now time.Time) Pick {
	rt, fail := s.route(req)
	if rt == nil {
		return fail
	}
	topic, labels := req.GetTopic(), req.GetLabels()
	placed := hasPlacement(labels)
	s.sels = s.sels[:0]
	if placed {
		for _, p := range s.cand {
			s.sels = append(s.sels, s.reg.Select(p.name, labels, isPlacementKey, now))
		}
	}
	stale := 0
	var w *registry.Worker
	var p *poolRoute
	if id := labels[LabelPreferredWorker]; id != "" {
		w, p = s.preferred(id, labels, placed)
	}
	if w == nil {
		w, p = s.best(placed)
	}
	for w != nil {
		if s.reg.Live(w, now) {
			return s.commit(job, w, p, rt)
		}
		// A stale pick: the worker stopped heartbeating but the sweep has
		// not evicted it yet. Take it out of placement and pick again.
		stale++
		s.pulledStale(topic, w)
		if stale > s.staleRetries {
			return Pick{Reason: jobstate.ReasonStaleWorker, Detail: strconv.Itoa(stale) +
				" picks in a row landed on workers that stopped heartbeating (last " + w.ID + ")"}
		}
		w, p = s.best(placed)
	}
	return s.noWorker(placed, stale)
}

// route resolves req's candidate pools into s.cand: its topic's pools,
// narrowed to the preferred pool, less those that do not provide
// meta.requires. With none it returns nil and the failed pick.
func (s *Strategy) route(req *capv1.JobRequest) (*route, Pick) {
	topic := req.GetTopic()
	rt := s.routes[topic]
	if rt == nil {
		return nil, Pick{Reason: jobstate.ReasonTopicUnmapped, Detail: "no pool is mapped to topic " + topic}
	}
	labels := req.GetLabels()
	pools := rt.pools
	if pref := labels[LabelPreferredPool]; pref != "" {
		i := 0
		for i < len(pools) && pools[i].name != pref {
			i++
		}
		if i == len(pools) {
			return nil, Pick{Reason: jobstate.ReasonPreferredPoolUnmapped,
				Detail: "preferred pool " + pref + " is not mapped to topic " + topic}
		}
		pools = pools[i : i+1]
	}
	requires := req.GetMeta().GetRequires()
	s.cand = s.cand[:0]
	for _, p := range pools {
		if providesAll(p.requires, requires) {
			s.cand = append(s.cand, p)
		}
	}
	if len(s.cand) == 0 {
		return nil, Pick{Reason: jobstate.ReasonRequiresUnsatisfied,
			Detail: "no pool of topic " + topic + " provides " + strings.Join(requires, ",")}
	}
	if s.cfg.Paused[topic] {
		// Checked last: a paused job waits in its candidate pools' queues
		// (Candidates), in order, for the resume.
		return nil, Pick{Reason: jobstate.ReasonPoolPaused, Detail: "topic " + topic + " is paused"}
	}
	return rt, Pick{}
}

// PickOn places job on w if w can take it — live, in one of its candidate
// pools, carrying its placement labels — without asking whether w has
// room: the caller owns the slot (it has just been freed by one of this
// node's jobs, or another replica offered it). ok is false when w cannot.
func (s *Strategy) PickOn(job string, w *registry.Worker, req *capv1.JobRequest, now time.Time) (Pick, bool) {
	rt, _ := s.route(req)
	if rt == nil || !s.reg.Live(w, now) || !carries(w, req.GetLabels()) {
		return Pick{}, false
	}
	for _, p := range s.cand {
		if p.name == w.Pool {
			return s.commit(job, w, p, rt), true
		}
	}
	return Pick{}, false
}

// preferred returns the preferred worker and its pool when it is a
// candidate and not overloaded; liveness is the caller's check.
func (s *Strategy) preferred(id string, labels map[string]string, placed bool) (*registry.Worker, *poolRoute) {
	w := s.reg.Get(id)
	if w == nil || s.reg.Overloaded(w) || s.reg.Away(w) || (placed && !carries(w, labels)) {
		return nil, nil
	}
	for _, p := range s.cand {
		if p.name == w.Pool {
			return w, p
		}
	}
	return nil, nil
}

// best returns the first worker in placement order over the candidate
// pools.
func (s *Strategy) best(placed bool) (*registry.Worker, *poolRoute) {
	var (
		best     *registry.Worker
		bestPool *poolRoute
	)
	for i, p := range s.cand {
		var w *registry.Worker
		if placed {
			w = s.sels[i].Top()
		} else {
			w = s.reg.Top(p.name)
		}
		if w != nil && (best == nil || w.Before(best)) {
			best, bestPool = w, p
		}
	}
	return best, bestPool
}

// pulledStale counts a pick that landed on a stale worker and takes the
// worker out of placement until it beats again.
func (s *Strategy) pulledStale(topic string, w *registry.Worker) {
	if s.onStale != nil {
		s.onStale(topic, w.ID)
	}
	s.reg.MarkStale(w)
}

// noWorker says why nothing was picked: some candidates are overloaded,
// or all known candidates went quiet (stale, not yet swept), or there are
// none. stale counts the stale picks this pick made.
func (s *Strategy) noWorker(placed bool, stale int) Pick {
	overloaded, away := 0, 0
	for i, p := range s.cand {
		if placed {
			overloaded += s.sels[i].OverloadedCount()
			stale += s.sels[i].StaleCount()
			away += s.sels[i].AwayCount()
		} else {
			overloaded += s.reg.OverloadedCount(p.name)
			stale += s.reg.StaleCount(p.name)
			away += s.reg.AwayCount(p.name)
		}
	}
	switch {
	case overloaded > 0:
		return Pick{Reason: jobstate.ReasonPoolOverloaded, Detail: s.overloaded()}
	case away > 0:
		// Their slots are placed by another replica, which offers this
		// node the room its own jobs leave.
		return Pick{Reason: jobstate.ReasonPoolOverloaded, Detail: "the workers of pools " + s.candNames() +
			" with room are placed by another replica"}
	case stale > 0:
		return Pick{Reason: jobstate.ReasonStaleWorker, Detail: "the workers of pools " + s.candNames() + " stopped heartbeating"}
	case placed:
		return Pick{Reason: jobstate.ReasonNoWorkers, Detail: "no live worker in pools " + s.candNames() + " carries the placement labels"}
	}
	detail := "no live worker in pools " + s.candNames()
	if stray := s.unroutedPools(); len(stray) > 0 {
		detail += "; workers heartbeat pools no topic routes to (" + strings.Join(stray, ",") +
			"): a heartbeat's pool must be a pool name from pools.yaml, not a topic"
	}
	return Pick{Reason: jobstate.ReasonNoWorkers, Detail: detail}
}

func (s *Strategy) candNames() string { return strings.Join(s.Candidates(), ",") }

// overloaded is the detail of a pick whose candidates are all overloaded.
func (s *Strategy) overloaded() string {
	if len(s.cand) != 1 {
		return "every live worker in pools " + s.candNames() + " is overloaded"
	}
	if s.overDetail == "" || s.overPool != s.cand[0].name {
		s.overPool = s.cand[0].name
		s.overDetail = "every live worker in pools " + s.overPool + " is overloaded"
	}
	return s.overDetail
}

// Candidates returns the names of the pools the last pick considered.
func (s *Strategy) Candidates() []string { return s.appendCandidates(make([]string, 0, len(s.cand))) }

// appendCandidates appends the names of the pools the last pick considered.
func (s *Strategy) appendCandidates(names []string) []string {
	for _, p := range s.cand {
		names = append(names, p.name)
	}
	return names
}

func (s *Strategy) commit(job string, w *registry.Worker, p *poolRoute, rt *route) Pick {
	if job == "" {
		s.reg.CountDispatch(w)
	} else {
		s.reg.Occupy(w, job)
	}
	direct := false
	switch p.dispatch {
	case DispatchDirect:
		// Forced direct, but never to a worker that has not said it
		// listens there (stock CAP workers do not): it gets the pool
		// subject, and the router warns once.
		direct = w.Direct
		if !w.Direct && s.onBlindDirect != nil {
			s.onBlindDirect(w, p.name)
		}
	case DispatchPool:
	default:
		direct = w.Direct
	}
	if !direct {
		return Pick{Worker: w, Subject: rt.subject}
	}
	if w.DirectSubject == "" {
		w.DirectSubject = s.subj(w.ID)
	}
	return Pick{Worker: w, Subject: w.DirectSubject, Direct: true}
}
