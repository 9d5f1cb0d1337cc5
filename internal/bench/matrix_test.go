package bench

import (
	"strings"
	"testing"
	"time"
)

// The ceilings are 1 / (CPU-s per job) of the busiest Redis master and of
// the busiest node; each master's figures are its own INFO deltas.
func TestCeilingsComeFromTheBusiestMasterAndNode(t *testing.T) {
	t.Parallel()
	r := &runner{cfg: Config{Jobs: 10_000, Node: NodeChild}, res: &Result{}}
	st := func(cpu float64, calls int64) serverStats {
		return serverStats{ok: true, cpuSec: cpu, calls: map[string]int64{"evalsha": calls, "info": 7}}
	}
	before := snapshot{masters: []masterStats{{"a:1", st(1, 100)}, {"b:2", st(2, 100)}}}
	after := snapshot{masters: []masterStats{{"a:1", st(1.25, 20_100)}, {"b:2", st(2.5, 30_100)}}}
	r.redisMasters(before, after)
	m := r.res.Redis.Masters
	if len(m) != 2 || m[0].Addr != "a:1" || m[0].Commands != 20_000 || m[1].CPUSecPer1k != 0.05 || m[1].CeilingJobsPerSec != 20_000 {
		t.Fatalf("masters %+v", m)
	}
	if c := r.res.Ceilings; c.BusiestMaster != "b:2" || c.RedisMasterJobsPerSec != 20_000 {
		t.Errorf("redis ceiling %+v, want b:2 at 20,000 jobs/s", c)
	}
	r.res.PerNode = []NodeFigures{{NodeID: "n1", CPUSec: 0.5}, {NodeID: "n2", CPUSec: 0.25}, {NodeID: "n3", CPUSec: 0.25}}
	r.nodeCeilings()
	if c := r.res.Ceilings; c.BusiestNode != "n1" || c.NodeCoreJobsPerSec != 20_000 || c.NodesBalancedJobsPerSec != 30_000 {
		t.Errorf("node ceilings %+v, want n1 at 20,000 jobs/s, 30,000 balanced", c)
	}
	// In-process nodes share the bench's CPU: no node ceiling.
	r.cfg.Node, r.res.Ceilings = NodeInProcess, Ceilings{}
	r.nodeCeilings()
	if r.res.Ceilings.NodeCoreJobsPerSec != 0 {
		t.Errorf("in-process nodes got a node ceiling: %+v", r.res.Ceilings)
	}
}

// MatrixTable puts one row per cell, the bench's workers first, then by
// Redis masters and nodes, with each node's share and each master's CPU.
func TestMatrixTable(t *testing.T) {
	t.Parallel()
	cell := func(nodes, masters int, mode WorkerMode, created ...int64) *Result {
		r := &Result{OK: true, NodeMode: NodeChild, Started: time.Unix(0, 0),
			Params: Params{Jobs: 100, Workers: 10, Nodes: nodes, RedisMasters: masters, WorkerMode: mode},
			Jobs:   Jobs{Succeeded: 100}, JobsPerSec: 1234, Node: NodeCost{Measured: true, CPUSecPer1k: 0.06}}
		for i, c := range created {
			r.PerNode = append(r.PerNode, NodeFigures{NodeID: "n" + string(rune('1'+i)), Created: c, CPUSec: 0.01, CPUSecPer1k: 0.02})
		}
		for range masters {
			r.Redis.Masters = append(r.Redis.Masters, RedisMaster{CPUSecPer1k: 0.0221})
		}
		return r
	}
	var b strings.Builder
	MatrixTable(&b, []*Result{cell(3, 3, WorkerCAP, 70, 15, 15), cell(1, 1, WorkerDirect, 100), cell(3, 1, WorkerDirect, 34, 33, 33)})
	var rows []string
	for l := range strings.SplitSeq(b.String(), "\n") {
		if strings.HasPrefix(l, "| bench") || strings.HasPrefix(l, "| stock") {
			rows = append(rows, l)
		}
	}
	if len(rows) != 3 {
		t.Fatalf("%d rows:\n%s", len(rows), b.String())
	}
	for i, want := range []string{"| bench (direct) | one Redis | 1 | 1234 | 100% |",
		"| bench (direct) | one Redis | 3 | 1234 | 34% / 33% / 33% |",
		"| stock CAP (pool) | cluster ×3 | 3 | 1234 | 70% / 15% / 15% |"} {
		if !strings.HasPrefix(rows[i], want) {
			t.Errorf("row %d: %s\nwant it to start %s", i, rows[i], want)
		}
	}
	if !strings.Contains(rows[2], "0.0221 / 0.0221 / 0.0221") || !strings.HasSuffix(rows[2], "| 0 | 0 | ok |") {
		t.Errorf("cluster row: %s", rows[2])
	}
}
