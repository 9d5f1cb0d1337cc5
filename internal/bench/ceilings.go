package bench

import (
	"fmt"
	"math"
)

// Per-master Redis figures and the ceilings a run's costs imply.
//
// Redis runs commands on one thread, so a master is saturated when its CPU
// reaches one second per second: at 1 / (its CPU-s per job) jobs/s, for the
// share of the keys it holds. A node is saturated on a core of its own at
// 1 / (its CPU-s per job). The busiest master and the busiest node bound the
// run; with N nodes sharing evenly, N / (their summed CPU-s per job) would.

// redisMasters fills res.Redis.Masters and the Redis ceiling from the two
// snapshots' per-master INFO readings (matched by address).
func (r *runner) redisMasters(before, after snapshot) {
	res, n := r.res, float64(r.cfg.Jobs)
	prev := map[string]masterStats{}
	for _, m := range before.masters {
		prev[m.addr] = m
	}
	for _, a := range after.masters {
		b, ok := prev[a.addr]
		if !ok || !a.ok || !b.ok {
			continue
		}
		calls, total := callsDelta(b.serverStats, a.serverStats)
		total -= calls["info"]
		cpu := math.Max(0, a.cpuSec-b.cpuSec)
		m := RedisMaster{Addr: a.addr, CPUSec: round3(cpu),
			CPUSecPer1k:    math.Round(cpu/n*1000*1e4) / 1e4,
			Commands:       total,
			CommandsPerJob: round3(float64(total) / n),
			EvalshaPerJob:  round3(float64(calls["evalsha"]) / n),
			ReadsPerJob:    round3(float64(a.reads-b.reads) / n)}
		if cpu > 0 {
			m.CeilingJobsPerSec = math.Round(n / cpu)
		}
		res.Redis.Masters = append(res.Redis.Masters, m)
	}
	var busiest *RedisMaster
	for i := range res.Redis.Masters {
		if m := &res.Redis.Masters[i]; busiest == nil || m.CPUSec > busiest.CPUSec {
			busiest = m
		}
	}
	if busiest != nil && busiest.CeilingJobsPerSec > 0 {
		res.Ceilings.RedisMasterJobsPerSec, res.Ceilings.BusiestMaster = busiest.CeilingJobsPerSec, busiest.Addr
	}
}

// nodeCeilings fills the node ceilings from the per-node figures, where each
// node's CPU is its own process's.
func (r *runner) nodeCeilings() {
	res, n := r.res, float64(r.cfg.Jobs)
	if r.cfg.nodesShareProcess() || len(res.PerNode) == 0 {
		return
	}
	var total, most float64
	for _, f := range res.PerNode {
		total += f.CPUSec
		if f.CPUSec > most {
			most, res.Ceilings.BusiestNode = f.CPUSec, f.NodeID
		}
	}
	if most <= 0 {
		return
	}
	res.Ceilings.NodeCoreJobsPerSec = math.Round(n / most)
	res.Ceilings.NodesBalancedJobsPerSec = math.Round(float64(len(res.PerNode)) * n / total)
}

// systemCeiling fills the whole system's CPU per 1,000 jobs and the rate
// at which it would fill this host's CPUs, where the nodes (child
// processes), Redis and nats-server were all measured. Redis and nats-server
// on another host, or a node inside the bench, leave it out.
func (r *runner) systemCeiling() {
	res := r.res
	if r.cfg.nodesShareProcess() || r.cfg.Node == NodeInProcess || !res.Node.Measured ||
		!res.Redis.ServerMeasured || res.NATS.ServerCPUSecPer1k <= 0 || loopbackPort(r.cfg.RedisURL) == 0 {
		return
	}
	total := res.Node.CPUSecPer1k + res.Redis.ServerCPUSecPer1k + res.NATS.ServerCPUSecPer1k + res.Harness.CPUSecPer1k
	if total <= 0 {
		return
	}
	res.Ceilings.SystemCPUSecPer1k = math.Round(total*1e4) / 1e4
	res.Ceilings.MachineJobsPerSec = math.Round(float64(res.Env.Machine.CPUs) * 1000 / total)
}

// ceilingsText is the report's line for the ceilings ("" when none).
func ceilingsText(c Ceilings) string {
	s := ""
	if c.RedisMasterJobsPerSec > 0 {
		s += fmt.Sprintf("one Redis master saturated at %.0f jobs/s (busiest: %s)", c.RedisMasterJobsPerSec, c.BusiestMaster)
	}
	if c.NodeCoreJobsPerSec > 0 {
		if s != "" {
			s += "; "
		}
		s += fmt.Sprintf("one node per core saturated at %.0f jobs/s (busiest: %s; %.0f if the nodes shared evenly)",
			c.NodeCoreJobsPerSec, c.BusiestNode, c.NodesBalancedJobsPerSec)
	}
	if c.MachineJobsPerSec > 0 {
		if s != "" {
			s += "; "
		}
		s += fmt.Sprintf("the whole system %.4f CPU-s per 1k jobs (nodes, Redis, nats-server, harness): this host's CPUs all busy at %.0f jobs/s",
			c.SystemCPUSecPer1k, c.MachineJobsPerSec)
	}
	return s
}
