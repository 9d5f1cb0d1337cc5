package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// The scale matrix (scripts/scale-matrix.sh) runs one bench per cell —
// nodes × Redis (one server or a cluster) × worker mode — and writes each
// Result as JSON; MatrixTable turns those into the markdown table
// BENCHMARKS.md carries (`troupe-bench matrix-table FILE.json...`).

// ReadResult reads one run's JSON output.
func ReadResult(path string) (*Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// MatrixTable writes a markdown table of runs, one row per run, ordered by
// worker mode, Redis masters and nodes; the machine and load averages of
// the runs go above it.
func MatrixTable(w io.Writer, runs []*Result) {
	if len(runs) == 0 {
		return
	}
	runs = slices.Clone(runs)
	slices.SortStableFunc(runs, func(a, b *Result) int {
		return cmp.Or(cmp.Compare(capOrder(a), capOrder(b)),
			cmp.Compare(a.Params.RedisMasters, b.Params.RedisMasters), cmp.Compare(a.Params.Nodes, b.Params.Nodes))
	})
	e := runs[0].Env
	fmt.Fprintf(w, "Machine: %s; redis %s; nats %s; git %s; %d jobs per cell, %d workers.\n",
		e.Machine, e.RedisVersion, e.NATSVersion, orUnknown(e.Git), runs[0].Params.Jobs, runs[0].Params.Workers)
	var loads []string
	for _, r := range runs {
		loads = append(loads, orUnknown(r.Env.LoadStart))
	}
	fmt.Fprintf(w, "Load average (1, 5, 15 min) at each cell's start: %s.\n\n", strings.Join(loads, "; "))
	fmt.Fprintln(w, "| workers | Redis | nodes | jobs/s | jobs created per node | forwards/job | node CPU-s/1k (per node) | "+
		"Redis CPU-s/1k per master | one master saturated at | one node per core saturated at | lost | twice | ok |")
	fmt.Fprintln(w, "|---|---|---|---:|---|---:|---|---|---:|---:|---:|---:|---|")
	for _, r := range runs {
		fmt.Fprintln(w, matrixRow(r))
	}
}

func matrixRow(r *Result) string {
	p := r.Params
	workers := "bench (direct)"
	if p.WorkerMode == WorkerCAP {
		workers = "stock CAP (pool)"
	}
	redis := "one Redis"
	if p.RedisMasters > 1 {
		redis = fmt.Sprintf("cluster ×%d", p.RedisMasters)
	}
	var shares, cpus, masters []string
	for _, n := range r.PerNode {
		shares = append(shares, fmt.Sprintf("%.0f%%", share(n.Created, p.Jobs)))
		if n.CPUSec > 0 {
			cpus = append(cpus, fmt.Sprintf("%.4f", n.CPUSecPer1k))
		}
	}
	for _, m := range r.Redis.Masters {
		masters = append(masters, fmt.Sprintf("%.4f", m.CPUSecPer1k))
	}
	fwd := "–"
	if r.Forwarding != nil {
		fwd = fmt.Sprintf("%.3f", r.Forwarding.PerJob)
	}
	cpu := "–"
	if r.Node.Measured {
		cpu = fmt.Sprintf("%.4f", r.Node.CPUSecPer1k)
		if len(cpus) > 1 {
			cpu += " (" + strings.Join(cpus, " / ") + ")"
		}
		if r.NodeMode == NodeInProcess {
			cpu += "*"
		}
	}
	lost := p.Jobs - r.Jobs.Succeeded
	ok := "ok"
	if !r.OK {
		ok = "FAILED: " + strings.Join(r.Failures, "; ")
	}
	return "| " + strings.Join([]string{workers, redis, strconv.Itoa(max(p.Nodes, 1)),
		fmt.Sprintf("%.0f", r.JobsPerSec), orDash(strings.Join(shares, " / ")), fwd, cpu,
		orDash(strings.Join(masters, " / ")), jobsPerSec(r.Ceilings.RedisMasterJobsPerSec),
		jobsPerSec(r.Ceilings.NodeCoreJobsPerSec), strconv.Itoa(lost), strconv.Itoa(r.Jobs.Duplicates), ok}, " | ") + " |"
}

func jobsPerSec(v float64) string {
	if v <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", v)
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// capOrder puts the bench's own workers before stock CAP workers.
func capOrder(r *Result) int {
	if r.Params.WorkerMode == WorkerCAP {
		return 1
	}
	return 0
}
