package admin

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Workers, pool mappings, node stats and the probes.

func (s *Server) listWorkers(w http.ResponseWriter, _ *http.Request, _ principal) error {
	ws, err := s.cfg.Node.Workers()
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, workerList(ws))
	return nil
}

// mappings returns the topic mappings in force, marking the runtime ones.
// The runtime set is read from Redis, not from the node's copy, so a
// change made through this API shows at once, before the node's watcher
// has picked it up.
func (s *Server) mappings(ctx context.Context) (PoolList, error) {
	rt, err := s.cfg.Node.Mappings().Load(ctx)
	if err != nil {
		return PoolList{}, err
	}
	cfg := s.cfg.Node.PoolConfig()
	out := PoolList{Version: rt.Version, Topics: []TopicMapping{}, Pools: []Pool{}}
	topics := map[string]TopicMapping{}
	if cfg != nil {
		for t, ps := range cfg.Topics {
			topics[t] = TopicMapping{Topic: t, Pools: ps, Source: "file"}
		}
		for name, p := range cfg.Pools {
			req := p.Requires
			if req == nil {
				req = []string{}
			}
			out.Pools = append(out.Pools, Pool{Name: name, Requires: req, Dispatch: string(p.Dispatch)})
		}
	}
	for t, ps := range rt.Topics {
		topics[t] = TopicMapping{Topic: t, Pools: ps, Source: "runtime"}
	}
	for t := range rt.Paused {
		m, ok := topics[t]
		if !ok {
			m = TopicMapping{Topic: t, Pools: []string{}, Source: "unmapped"}
		}
		m.Paused = true
		topics[t] = m
	}
	for _, m := range topics {
		out.Topics = append(out.Topics, m)
	}
	sort.Slice(out.Topics, func(i, j int) bool { return out.Topics[i].Topic < out.Topics[j].Topic })
	sort.Slice(out.Pools, func(i, j int) bool { return out.Pools[i].Name < out.Pools[j].Name })
	return out, nil
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request, _ principal) error {
	out, err := s.mappings(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getPool(w http.ResponseWriter, r *http.Request, _ principal) error {
	out, err := s.mappings(r.Context())
	if err != nil {
		return err
	}
	topic := r.PathValue("topic")
	for _, m := range out.Topics {
		if m.Topic == topic {
			writeJSON(w, http.StatusOK, m)
			return nil
		}
	}
	return errNotFound("topic " + topic + " is not mapped")
}

// putPool maps a topic to pools at run time, for every replica.
func (s *Server) putPool(w http.ResponseWriter, r *http.Request, _ principal) error {
	var body PoolMapping
	if err := readJSON(r, &body); err != nil {
		return err
	}
	topic := r.PathValue("topic")
	if err := s.cfg.Node.Mappings().Set(r.Context(), topic, body.Pools...); err != nil {
		return err
	}
	s.audit("topic mapped", "topic", topic, "pools", body.Pools)
	writeJSON(w, http.StatusOK, TopicMapping{Topic: topic, Pools: body.Pools, Source: "runtime"})
	return nil
}

// deletePool drops a topic's runtime mapping; pools.yaml's, if any,
// applies again. Mappings from the file are changed in the file.
func (s *Server) deletePool(w http.ResponseWriter, r *http.Request, _ principal) error {
	topic := r.PathValue("topic")
	ms := s.cfg.Node.Mappings()
	rt, err := ms.Load(r.Context())
	if err != nil {
		return err
	}
	if _, ok := rt.Topics[topic]; !ok {
		return errNotFound("topic " + topic + " has no runtime mapping (pools.yaml mappings are changed in the file)")
	}
	if err := ms.Delete(r.Context(), topic); err != nil {
		return err
	}
	s.audit("topic unmapped", "topic", topic)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// Metric names the stats read from the node's registry.
const (
	metricReceived   = "troupe_jobs_received_total"
	metricDispatched = "troupe_jobs_dispatched_total"
	metricCompleted  = "troupe_jobs_completed_total"
)

// stats is what the dashboard polls: jobs per state (cluster-wide, from
// the Redis indexes) and this node's counters, from which the page derives
// throughput over time.
func (s *Server) stats(w http.ResponseWriter, r *http.Request, _ principal) error {
	counts, err := s.cfg.Node.CountStates(r.Context())
	if err != nil {
		return err
	}
	out := Stats{Node: s.cfg.Node.ID(), At: time.Now(), States: map[string]int64{}, Completed: map[string]float64{}}
	for st, n := range counts {
		out.States[string(st)] = n
	}
	c, err := counters(s.cfg.Registry)
	if err != nil {
		return err
	}
	out.Received, out.Dispatched, out.Completed = c.received, c.dispatched, c.completed
	out.History = s.sampler.history()
	if n, err := s.cfg.Node.LiveJobActors(); err == nil {
		out.LiveJobActors = n
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// jobCounters are the node's job counters.
type jobCounters struct {
	received, dispatched float64
	completed            map[string]float64 // by status
}

// counters reads the job counters from the node's registry.
func counters(reg *prometheus.Registry) (jobCounters, error) {
	c := jobCounters{completed: map[string]float64{}}
	mfs, err := reg.Gather()
	if err != nil {
		return c, err
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case metricReceived:
			c.received = sumCounter(mf, nil)
		case metricDispatched:
			c.dispatched = sumCounter(mf, nil)
		case metricCompleted:
			sumCounter(mf, func(m *dto.Metric, v float64) {
				for _, l := range m.GetLabel() {
					if l.GetName() == "status" {
						c.completed[l.GetValue()] += v
					}
				}
			})
		}
	}
	return c, nil
}

// sumCounter adds a counter family's values, calling each with every
// series when set.
func sumCounter(mf *dto.MetricFamily, each func(*dto.Metric, float64)) float64 {
	var total float64
	for _, m := range mf.GetMetric() {
		v := m.GetCounter().GetValue()
		total += v
		if each != nil {
			each(m, v)
		}
	}
	return total
}

func (s *Server) whoami(w http.ResponseWriter, _ *http.Request, p principal) error {
	writeJSON(w, http.StatusOK, WhoAmI{Tenant: p.tenant, Node: s.cfg.Node.ID()})
	return nil
}

// getSaga returns a workflow's saga report.
func (s *Server) getSaga(w http.ResponseWriter, r *http.Request, _ principal) error {
	rep, err := s.cfg.Node.Saga(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rep)
	return nil
}

// healthz says the process serves HTTP; it checks nothing else, so an
// orchestrator restarts the process only when it is truly stuck.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz runs the node's readiness checks (NATS, streams, Redis, registry).
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ReadyTimeout)
	defer cancel()
	err := s.cfg.Node.Ready(ctx)
	if err == nil {
		writeJSON(w, http.StatusOK, Ready{Ready: true})
		return
	}
	out := Ready{Failed: map[string]string{}}
	var checks interface{ FailedChecks() map[string]string }
	if errors.As(err, &checks) {
		out.Failed = checks.FailedChecks()
	} else {
		out.Failed["node"] = err.Error()
	}
	writeJSON(w, http.StatusServiceUnavailable, out)
}
