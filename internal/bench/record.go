package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// WriteOutputs writes res as JSON into dir, named after the run, and
// records its path in res.Files. The JSON carries the latency histograms and
// the throughput series for whatever plots them.
func WriteOutputs(res *Result, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	res.Files.JSON = filepath.Join(dir, fmt.Sprintf("%s-%s-%s.json", res.Started.Format("20060102-150405"), res.Target, res.RunID))
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(res.Files.JSON, append(b, '\n'), 0o644)
}

// WriteComparison writes both runs' outputs and a JSON of the comparison.
func WriteComparison(c *Comparison, dir string) (string, error) {
	var errs []error
	for _, r := range []*Result{c.Troupe, c.Floor} {
		if r != nil {
			errs = append(errs, WriteOutputs(r, dir))
		}
	}
	if c.Troupe == nil {
		return "", errors.Join(errs...)
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-compare-%s.json", c.Troupe.Started.Format("20060102-150405"), c.Troupe.RunID))
	b, err := json.MarshalIndent(c, "", "  ")
	if err == nil {
		err = os.WriteFile(path, append(b, '\n'), 0o644)
	}
	errs = append(errs, err)
	return path, errors.Join(errs...)
}

// FormatReport writes a human summary of res.
func FormatReport(w io.Writer, res *Result) {
	p := res.Params
	fmt.Fprintf(w, "troupe-bench: %s, node %s", res.Target, res.NodeMode)
	if p.Nodes > 1 {
		fmt.Fprintf(w, " ×%d (replicas sharing the run's Redis and NATS)", p.Nodes)
	}
	if p.RedisMasters > 1 {
		fmt.Fprintf(w, ", Redis Cluster of %d masters", p.RedisMasters)
	}
	if p.WorkerMode == WorkerCAP {
		fmt.Fprintf(w, ", stock CAP workers (pool subject)")
	}
	if res.Node.PID > 0 {
		fmt.Fprintf(w, " (pid %d)", res.Node.PID)
	}
	fmt.Fprintf(w, ", %d jobs, %d workers, %s", p.Jobs, p.Workers, rateText(p.Rate))
	if p.DelayMs > 0 {
		fmt.Fprintf(w, ", worker delay %.1f ms", p.DelayMs)
	}
	fmt.Fprintf(w, ", run %s\n", res.RunID)
	status := "OK"
	if !res.OK {
		status = "FAILED: " + strings.Join(res.Failures, "; ")
	}
	j := res.Jobs
	fmt.Fprintf(w, "  result        %s\n", status)
	fmt.Fprintf(w, "  jobs          %d submitted, %d SUCCEEDED, %d other terminal, %d not terminal, %d received twice, %d never received\n",
		j.Submitted, j.Succeeded, j.NotSucceeded, j.NotTerminal, j.Duplicates, j.NeverReceived)
	fmt.Fprintf(w, "  throughput    %.0f jobs/s (%.3f s from first submit to last terminal write)\n", res.JobsPerSec, res.DurationSec)
	fmt.Fprintf(w, "  dispatch      %s   (submit → worker receipt, bench clock)\n", pctText(res.DispatchMs))
	fmt.Fprintf(w, "  submit→term   %s   (submit → node's terminal write, 1 ms resolution)\n", pctText(res.SubmitToTerminalMs))
	st := res.Stages
	fmt.Fprintf(w, "  stages        p50/p99 ms: submit→record %s, record→dispatched %s, answer→terminal %s\n",
		stageText(st.SubmitToRecordMs), stageText(st.RecordToDispatchedMs), stageText(st.AnswerToTerminalMs))
	n := res.Node
	if n.Measured {
		fmt.Fprintf(w, "  node          %.4f CPU-s per 1k jobs (idle: %.1f CPU-ms/s), peak RSS %.1f MiB",
			n.CPUSecPer1k, n.IdleCPUMsPerSec, float64(n.PeakRSSBytes)/(1<<20))
		if n.MemMeasured {
			fmt.Fprintf(w, ", %d GCs, %.0f B and %.0f allocs per job", n.GCs, n.AllocBytesPerJob, n.MallocsPerJob)
		}
		fmt.Fprintf(w, "   [%s]\n", n.Scope)
	} else {
		fmt.Fprintf(w, "  node          CPU and RSS not measured [%s]\n", n.Scope)
	}
	if p.Nodes > 1 || len(res.PerNode) > 0 {
		formatNodes(w, res)
	}
	rd := res.Redis
	fmt.Fprintf(w, "  redis         ")
	if rd.ClientMeasured {
		fmt.Fprintf(w, "%.2f commands/job sent in %.3f round trips/job (%s); ", rd.ClientCommandsPerJob, rd.RoundTripsPerJob, byNameText(rd.ClientByName))
	}
	if rd.ServerMeasured {
		fmt.Fprintf(w, "server ran %.2f commands/job (%s); redis CPU %.4f s/1k", rd.ServerCommandsPerJob, byNameText(rd.ServerByName), rd.ServerCPUSecPer1k)
	}
	fmt.Fprintln(w)
	for _, m := range rd.Masters {
		fmt.Fprintf(w, "  redis master  %s: %.3f CPU-s = %.4f s/1k jobs, %d commands = %.2f per job (evalsha %.3f), %.3f reads per job",
			m.Addr, m.CPUSec, m.CPUSecPer1k, m.Commands, m.CommandsPerJob, m.EvalshaPerJob, m.ReadsPerJob)
		if m.CeilingJobsPerSec > 0 {
			fmt.Fprintf(w, "; saturated at %.0f jobs/s", m.CeilingJobsPerSec)
		}
		fmt.Fprintln(w)
	}
	if c := ceilingsText(res.Ceilings); c != "" {
		fmt.Fprintf(w, "  ceilings      %s\n", c)
	}
	na := res.NATS
	fmt.Fprintf(w, "  nats          ")
	if na.NodeMeasured {
		fmt.Fprintf(w, "node %.2f in + %.2f out, ", na.NodeInPerJob, na.NodeOutPerJob)
	}
	fmt.Fprintf(w, "bench %.2f in + %.2f out = %.2f messages/job (client-side)", na.BenchInPerJob, na.BenchOutPerJob, na.TotalPerJob)
	if na.ServerCPUSecPer1k > 0 {
		fmt.Fprintf(w, "; nats-server CPU %.4f s/1k", na.ServerCPUSecPer1k)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  harness       %.4f CPU-s per 1k jobs (bench process)\n", res.Harness.CPUSecPer1k)
	if res.Hold != nil {
		formatHold(w, res.Hold)
	}
	if len(res.PerWorker) > 0 {
		fmt.Fprintf(w, "  per worker    min %d max %d receipts (warm-up included)\n", slices.Min(res.PerWorker), slices.Max(res.PerWorker))
	}
	fmt.Fprintf(w, "  capacity      %s\n", capacityText(res))
	fmt.Fprintf(w, "  env           %s; redis %s; nats %s; git %s\n",
		res.Env.Machine, res.Env.RedisVersion, res.Env.NATSVersion, orUnknown(res.Env.Git))
	fmt.Fprintf(w, "  load average  %s at start, %s at end (1, 5, 15 min; above ~0.5 at start, another program shares the machine)\n",
		orUnknown(res.Env.LoadStart), orUnknown(res.Env.LoadEnd))
	for _, note := range res.Notes {
		fmt.Fprintf(w, "  note          %s\n", note)
	}
	if res.Files.JSON != "" {
		fmt.Fprintf(w, "  files         %s", res.Files.JSON)
		if res.Files.CPUProfile != "" {
			fmt.Fprintf(w, " %s", res.Files.CPUProfile)
		}
		fmt.Fprintln(w)
	}
}

// formatNodes prints what several nodes cost each other and each node's
// share.
func formatNodes(w io.Writer, res *Result) {
	if f := res.Forwarding; f != nil && res.Params.Nodes > 1 {
		fmt.Fprintf(w, "  forwarding    %d results/cancels forwarded to their job's owner = %.3f per job (%d of them handed back "+
			"to JetStream); %d activations found the job owned by another node = %.3f per job\n",
			f.Taken+f.Returned, f.PerJob, f.Returned, f.BusyActivations, f.BusyPerJob)
	}
	for i, n := range res.PerNode {
		fmt.Fprintf(w, "  node %-9d%s", i+1, n.NodeID)
		if n.PID > 0 {
			fmt.Fprintf(w, " (pid %d)", n.PID)
		}
		if n.CPUSec > 0 || n.PeakRSSBytes > 0 {
			fmt.Fprintf(w, ": %.3f CPU-s = %.4f per 1k jobs of the run, peak RSS %.1f MiB", n.CPUSec, n.CPUSecPer1k,
				float64(n.PeakRSSBytes)/(1<<20))
		}
		fmt.Fprintf(w, "; created %d (%.1f%%), dispatched %d, completed %d jobs; forwarded %d, %d busy activations; "+
			"%d submits redelivered, %d submit touches; %d job locks lost; redis %.2f commands, nats %.2f messages per job of the run\n",
			n.Created, share(n.Created, res.Params.Jobs), n.Dispatched, n.Completed, n.Forwarded, n.Busy,
			n.SubmitsRedelivered, n.SubmitTouches, n.LocksLost, n.RedisCommandsPerJob, n.NATSPerJob)
	}
}

// capacityText is the workers' stated limit, what they counted against it
// over the measured run, and the node's capacity waits per job.
func capacityText(res *Result) string {
	s := fmt.Sprintf("workers state max_parallel %s: at most %d held at once by one worker", maxParText(res.Params.MaxParallel), res.MaxHeld)
	if res.Params.MaxParallel > 0 {
		s += fmt.Sprintf(", %d overfills (receipts at or past the limit)", res.Overfills)
	}
	if k := res.Keys; k != nil {
		s += fmt.Sprintf("; %d concurrency keys limited to %d: at most %d of one key held at once, %d key overfills; "+
			"makespan %.3f s vs ideal %.3f s (%+.1f %%); %d slot hand-offs (a key's answer → its next receipt) "+
			"mean %.1f ms, p50 %.1f, p90 %.1f, p99 %.1f, max %.1f; %d of them 20 s or more into the run, mean %.1f ms",
			k.Keys, k.Limit, k.MaxHeld, k.Overfills, res.DurationSec, k.IdealMakespanSec, k.OverIdealPct,
			k.Gaps, k.GapMeanMs, k.GapP50Ms, k.GapP90Ms, k.GapP99Ms, k.GapMaxMs, k.LateGaps, k.LateGapMeanMs)
	}
	if res.CapacityWaitsPerJob != nil {
		s += fmt.Sprintf("; node %.3f capacity waits/job written (pool_overloaded/no_workers transitions)", *res.CapacityWaitsPerJob)
	}
	if res.UnwrittenWaitsPerJob != nil {
		s += fmt.Sprintf(", %.3f waited unwritten within the grace", *res.UnwrittenWaitsPerJob)
	}
	return s
}

// maxParText is an announced max_parallel_jobs, 0 being no limit.
func maxParText(n int32) string {
	if n <= 0 {
		return "none"
	}
	return strconv.Itoa(int(n))
}

// stageText is a stage's p50/p99, or "n/a" when the target keeps no
// timestamp for it (the floor writes no history).
func stageText(p Percentiles) string {
	if p.Count == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f/%.1f", p.P50, p.P99)
}

func rateText(rate float64) string {
	if rate <= 0 {
		return "full speed"
	}
	return fmt.Sprintf("%.0f jobs/s offered", rate)
}

func pctText(p Percentiles) string {
	return fmt.Sprintf("p50 %.2f  p90 %.2f  p99 %.2f  max %.2f ms", p.P50, p.P90, p.P99, p.Max)
}

// byNameText lists the largest per-job command counts, largest first.
func byNameText(m map[string]float64) string {
	type kv struct {
		k string
		v float64
	}
	var all []kv
	for k, v := range m {
		all = append(all, kv{k, v})
	}
	slices.SortFunc(all, func(a, b kv) int {
		if a.v != b.v {
			if a.v > b.v {
				return -1
			}
			return 1
		}
		return strings.Compare(a.k, b.k)
	})
	var parts []string
	for i, e := range all {
		if i == 6 {
			parts = append(parts, "…")
			break
		}
		parts = append(parts, fmt.Sprintf("%s %.2f", e.k, e.v))
	}
	return strings.Join(parts, ", ")
}

// RunsMarker ends the runs table in BENCHMARKS.md; rows are inserted above it.
const RunsMarker = "<!-- troupe-bench: new rows go above this line -->"

// Row is res as one line of BENCHMARKS.md's runs table. note (may be empty)
// goes in the last column.
func Row(res *Result, note string) string {
	p := res.Params
	mode := string(res.NodeMode)
	if p.Nodes > 1 {
		mode += fmt.Sprintf(" ×%d", p.Nodes)
	}
	params := fmt.Sprintf("%d jobs, %d w, %s", p.Jobs, p.Workers, rateText(p.Rate))
	if p.DelayMs > 0 {
		params += fmt.Sprintf(", delay %.0f ms", p.DelayMs)
	}
	params += ", max-par " + maxParText(p.MaxParallel)
	if p.RedisMasters > 1 {
		params += fmt.Sprintf(", Redis Cluster ×%d", p.RedisMasters)
	}
	if p.WorkerMode == WorkerCAP {
		params += ", stock CAP workers"
	}
	cpu, rss := "–", "–"
	if res.Node.Measured {
		cpu = fmt.Sprintf("%.4f", res.Node.CPUSecPer1k)
		rss = fmt.Sprintf("%.0f", float64(res.Node.PeakRSSBytes)/(1<<20))
		if res.NodeMode == NodeInProcess {
			cpu += "*"
			rss += "*"
		}
	}
	redis := "–"
	switch {
	case res.Redis.ClientMeasured && res.Redis.ServerMeasured:
		redis = fmt.Sprintf("%.2f / %.2f / %.3f", res.Redis.ClientCommandsPerJob, res.Redis.ServerCommandsPerJob, res.Redis.RoundTripsPerJob)
	case res.Redis.ServerMeasured:
		redis = fmt.Sprintf("– / %.2f / –", res.Redis.ServerCommandsPerJob)
	}
	status := "ok"
	if !res.OK {
		status = "FAILED"
	}
	if res.Jobs.Duplicates > 0 {
		status += fmt.Sprintf(", %d dup", res.Jobs.Duplicates)
	}
	status += "; " + capacityCell(res)
	cells := []string{
		res.Started.Format("2006-01-02 15:04"), orUnknown(res.Env.Git), string(res.Target), mode, params,
		fmt.Sprintf("%.0f", res.JobsPerSec),
		fmt.Sprintf("%.2f / %.2f / %.2f / %.2f", res.DispatchMs.P50, res.DispatchMs.P90, res.DispatchMs.P99, res.DispatchMs.Max),
		fmt.Sprintf("%.1f / %.1f / %.1f", res.SubmitToTerminalMs.P50, res.SubmitToTerminalMs.P99, res.SubmitToTerminalMs.Max),
		cpu, rss, redis, fmt.Sprintf("%.2f", res.NATS.TotalPerJob), status,
		fmt.Sprintf("%s; redis %s, nats %s; load %s → %s", res.Env.Machine, res.Env.RedisVersion, res.Env.NATSVersion,
			orUnknown(res.Env.LoadStart), orUnknown(res.Env.LoadEnd)), note,
	}
	for i, c := range cells {
		cells[i] = strings.ReplaceAll(c, "|", "/")
	}
	return "| " + strings.Join(cells, " | ") + " |"
}

// capacityCell is the capacity figures for the row's result column (the
// table keeps its columns): peak held, overfills, capacity waits per job.
func capacityCell(res *Result) string {
	s := fmt.Sprintf("held ≤%d", res.MaxHeld)
	if res.Params.MaxParallel > 0 {
		s += fmt.Sprintf(", %d overfills", res.Overfills)
	}
	if res.CapacityWaitsPerJob != nil {
		s += fmt.Sprintf(", %.3f waits/job", *res.CapacityWaitsPerJob)
	}
	if res.UnwrittenWaitsPerJob != nil {
		s += fmt.Sprintf(" (+%.3f unwritten)", *res.UnwrittenWaitsPerJob)
	}
	if res.Params.Nodes > 1 && res.Forwarding != nil {
		s += fmt.Sprintf(", %.3f forwarded/job", res.Forwarding.PerJob)
	}
	if k := res.Keys; k != nil {
		s += fmt.Sprintf("; %d keys ≤%d: key held ≤%d, %d key overfills, makespan %+.1f %% of ideal %.2f s, "+
			"hand-off p50/p90/p99 %.0f/%.0f/%.0f ms", k.Keys, k.Limit, k.MaxHeld, k.Overfills, k.OverIdealPct, k.IdealMakespanSec,
			k.GapP50Ms, k.GapP90Ms, k.GapP99Ms)
	}
	return s
}

// RowHeader is the runs table's header, matching Row.
const RowHeader = "| date | git | target | node | parameters | jobs/s | dispatch p50 / p90 / p99 / max ms | submit→terminal p50 / p99 / max ms | node CPU-s per 1k | node peak RSS MiB | Redis cmds/job client / server / round trips | NATS msgs/job | result | machine | note |\n" +
	"|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

// AppendRows inserts rows above RunsMarker in the file at path.
func AppendRows(path string, rows ...string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i := strings.Index(s, RunsMarker)
	if i < 0 {
		return fmt.Errorf("bench: %s has no runs marker %q", path, RunsMarker)
	}
	var add strings.Builder
	for _, r := range rows {
		add.WriteString(r)
		add.WriteByte('\n')
	}
	s = s[:i] + add.String() + s[i:]
	return os.WriteFile(path, []byte(s), 0o644)
}

// share is part of whole in percent (0 when whole is 0).
func share(part int64, whole int) float64 {
	if whole <= 0 {
		return 0
	}
	return float64(part) / float64(whole) * 100
}
