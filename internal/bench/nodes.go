package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// Several nodes (Config.Nodes > 1): N Troupe nodes on one run's prefixes,
// with distinct node ids. They share the streams' durable consumers (a
// submit, result or cancel goes to whichever node fetches it), the Redis
// keys and the workers, as replicas in production do. A result fetched by a
// node that does not own its job finds the job's lock held by the owner
// (troupe_job_activations_busy_total) and is forwarded to it over NATS
// (troupe_events_forwarded_total); the bench reports both per job, and each
// node's own figures.

// nodeIDs are the ids of a run's n nodes: "bench-<run>" for one node (as
// before several existed), "bench-<run>-1" … "bench-<run>-<n>" otherwise.
func nodeIDs(run string, n int) []string {
	if n <= 1 {
		return []string{"bench-" + run}
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "bench-" + run + "-" + strconv.Itoa(i+1)
	}
	return ids
}

// nodesTarget is several nodes answering as one target: their counters
// summed, the worker view the smallest any node has. Each part is a child
// process or a node inside the bench.
type nodesTarget struct {
	parts []target
	// shared: the nodes run inside the bench process, so CPU, RSS and the
	// Go runtime's figures are the process's, read once rather than summed.
	shared bool
	// profiles are the per-node CPU profile paths while one is running.
	profiles []string
}

// startNodes starts one node per id from spec, one after another (the first
// creates the streams and consumers the others then find), in child
// processes or inside the bench. A failed start stops the nodes already
// running.
func startNodes(ctx context.Context, cfg Config, spec sutSpec, ids []string, log *slog.Logger) (*nodesTarget, error) {
	t := &nodesTarget{shared: cfg.Node == NodeInProcess}
	for _, id := range ids {
		s := spec
		s.NodeID = id
		var (
			p   target
			err error
		)
		switch cfg.Node {
		case NodeChild:
			p, err = startChild(cfg.ChildCommand, s, cfg.Stderr)
		case NodeInProcess:
			p, err = startInProc(ctx, s, log.With("node", id))
		default:
			err = fmt.Errorf("%w: several nodes run as children or in process, not %q", ErrConfig, cfg.Node)
		}
		if err != nil {
			_ = t.stop(context.Background())
			return nil, fmt.Errorf("bench: node %s: %w", id, err)
		}
		t.parts = append(t.parts, p)
	}
	return t, nil
}

// pid is the bench's own with in-process nodes, 0 with several processes
// (each node's is in its Snap).
func (t *nodesTarget) pid() int {
	if t.shared {
		return t.parts[0].pid()
	}
	return 0
}

func (t *nodesTarget) scope() string {
	if t.shared {
		return fmt.Sprintf("bench process (%d nodes and harness together)", len(t.parts))
	}
	return fmt.Sprintf("%d node processes (children of the bench), summed", len(t.parts))
}

// workers is the fewest workers any node sees: the run waits until every
// node knows every worker.
func (t *nodesTarget) workers(ctx context.Context) (int, error) {
	least := math.MaxInt
	for _, p := range t.parts {
		n, err := p.workers(ctx)
		if err != nil {
			return 0, err
		}
		least = min(least, n)
	}
	return least, nil
}

// snap reads every node and sums them; Parts keeps each node's reading
// (with its pid). What some node could not read is reported as not read.
func (t *nodesTarget) snap(ctx context.Context) (Snap, snapHas, error) {
	var (
		sum  Snap
		has  = snapHas{CPU: true, RSS: true, Redis: true, NATS: true, Mem: true}
		errs []error
	)
	sum.Parts = make([]Snap, 0, len(t.parts))
	for i, p := range t.parts {
		sn, h, err := p.snap(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		sn.PID = p.pid()
		has.CPU, has.RSS, has.Redis = has.CPU && h.CPU, has.RSS && h.RSS, has.Redis && h.Redis
		has.NATS, has.Mem = has.NATS && h.NATS, has.Mem && h.Mem
		process := !t.shared || i == 0
		sum = addSnap(sum, sn, process)
		sum.Parts = append(sum.Parts, sn)
	}
	return sum, has, errors.Join(errs...)
}

// addSnap adds b's counters to a. The process figures (CPU, RSS, the Go
// runtime's) are added only when process is set: nodes inside one process
// all read the same ones.
func addSnap(a, b Snap, process bool) Snap {
	if process {
		a.CPU += b.CPU
		a.PeakRSS += b.PeakRSS
		a.RSS += b.RSS
		a.GCs += b.GCs
		a.AllocBytes += b.AllocBytes
		a.Mallocs += b.Mallocs
		a.HeapAlloc += b.HeapAlloc
	}
	a.Redis = a.Redis.add(b.Redis)
	a.NATSIn += b.NATSIn
	a.NATSOut += b.NATSOut
	a.LiveActors += b.LiveActors
	a.Parked += b.Parked
	if b.CapacityWaits != nil {
		w := *b.CapacityWaits
		if a.CapacityWaits != nil {
			w += *a.CapacityWaits
		}
		a.CapacityWaits = &w
	}
	if b.Node != nil {
		n := *b.Node
		if a.Node != nil {
			n = a.Node.add(n)
		}
		a.Node = &n
	}
	return a
}

// add is a + b, name by name.
func (a RedisCounts) add(b RedisCounts) RedisCounts {
	out := RedisCounts{Commands: a.Commands + b.Commands, RoundTrips: a.RoundTrips + b.RoundTrips,
		ByName: make(map[string]int64, max(len(a.ByName), len(b.ByName)))}
	for k, v := range a.ByName {
		out.ByName[k] += v
	}
	for k, v := range b.ByName {
		out.ByName[k] += v
	}
	return out
}

func (a NodeCounters) add(b NodeCounters) NodeCounters {
	return NodeCounters{Received: a.Received + b.Received, Dispatched: a.Dispatched + b.Dispatched,
		Completed: a.Completed + b.Completed, ForwardTaken: a.ForwardTaken + b.ForwardTaken,
		ForwardReturned: a.ForwardReturned + b.ForwardReturned, Busy: a.Busy + b.Busy,
		UnwrittenWaits:     a.UnwrittenWaits + b.UnwrittenWaits,
		SubmitsRedelivered: a.SubmitsRedelivered + b.SubmitsRedelivered, SubmitTouches: a.SubmitTouches + b.SubmitTouches,
		LocksLost: a.LocksLost + b.LocksLost}
}

func (a NodeCounters) sub(b NodeCounters) NodeCounters {
	return NodeCounters{Received: a.Received - b.Received, Dispatched: a.Dispatched - b.Dispatched,
		Completed: a.Completed - b.Completed, ForwardTaken: a.ForwardTaken - b.ForwardTaken,
		ForwardReturned: a.ForwardReturned - b.ForwardReturned, Busy: a.Busy - b.Busy,
		UnwrittenWaits:     a.UnwrittenWaits - b.UnwrittenWaits,
		SubmitsRedelivered: a.SubmitsRedelivered - b.SubmitsRedelivered, SubmitTouches: a.SubmitTouches - b.SubmitTouches,
		LocksLost: a.LocksLost - b.LocksLost}
}

// errOneNode: hold runs sample one node.
var errOneNode = errors.New("bench: hold runs and heap profiles need a single node (--nodes 1)")

func (t *nodesTarget) inflight(context.Context) (Snap, error) { return Snap{}, errOneNode }
func (t *nodesTarget) heapProfile(string) error               { return errOneNode }

// startProfile profiles every node process into a file of its own: path
// with "-<n>" before its extension for node n (1-based). In-process nodes
// share the bench process: one profile, at path.
func (t *nodesTarget) startProfile(path string) error {
	t.profiles = nil
	if t.shared {
		return t.parts[0].startProfile(path)
	}
	for i, p := range t.parts {
		np := nodeProfilePath(path, i+1)
		if err := p.startProfile(np); err != nil {
			_ = t.stopProfile()
			return fmt.Errorf("node %d: %w", i+1, err)
		}
		t.profiles = append(t.profiles, np)
	}
	return nil
}

func (t *nodesTarget) stopProfile() error {
	if t.shared {
		return t.parts[0].stopProfile()
	}
	var errs []error
	for i := range t.profiles {
		errs = append(errs, t.parts[i].stopProfile())
	}
	return errors.Join(errs...)
}

// nodeProfilePath is path with "-<n>" inserted before its extension.
func nodeProfilePath(path string, n int) string {
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + "-" + strconv.Itoa(n) + ext
}

// stop stops every node at once (each stop drains its node).
func (t *nodesTarget) stop(ctx context.Context) error {
	errs := make([]error, len(t.parts))
	var wg sync.WaitGroup
	for i, p := range t.parts {
		wg.Go(func() { errs[i] = p.stop(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// NodeFigures are one node's share of a run with several nodes, over the
// measured window.
type NodeFigures struct {
	NodeID string `json:"node_id"`
	// PID, CPUSec and PeakRSSBytes are the node process's own (child mode;
	// in-process nodes share the bench process: they stay 0).
	PID          int     `json:"pid,omitempty"`
	CPUSec       float64 `json:"cpu_s,omitempty"`
	CPUSecPer1k  float64 `json:"cpu_s_per_1k_jobs,omitempty"`
	PeakRSSBytes int64   `json:"peak_rss_bytes,omitempty"`
	// Created, Dispatched, Completed: the measured jobs this node created
	// from their submit, dispatched to a worker and wrote terminal.
	Created    int64 `json:"created"`
	Dispatched int64 `json:"dispatched"`
	Completed  int64 `json:"completed"`
	// Forwarded: results and cancels this node passed to the node owning
	// their job (taken or returned); Busy: its activations that found the
	// job owned by another node.
	Forwarded int64 `json:"forwarded"`
	Busy      int64 `json:"busy_activations"`
	// RedisCommands and NATS messages this node's clients sent (and
	// received), per job of the whole run.
	RedisCommandsPerJob float64 `json:"redis_commands_per_job"`
	NATSPerJob          float64 `json:"nats_msgs_per_job"`
	// SubmitsRedelivered: submits it took on a second or later delivery;
	// SubmitTouches: in-progress signals it sent for held submits.
	SubmitsRedelivered int64 `json:"submits_redelivered"`
	SubmitTouches      int64 `json:"submit_touches"`
	// LocksLost: job locks its renewer reported lost over the run.
	LocksLost int64 `json:"locks_lost"`
}

// ForwardingCost is what several nodes cost each other: the results and
// cancels one node fetched for a job another ran.
type ForwardingCost struct {
	// Taken and Returned: results and cancels passed to the node owning
	// their job, which took them, or did not (the message then went back to
	// JetStream for redelivery).
	Taken    int64 `json:"taken"`
	Returned int64 `json:"returned"`
	// PerJob = (Taken + Returned) / jobs.
	PerJob float64 `json:"forwarded_per_job"`
	// BusyActivations: activations that found the job's lock held by
	// another node. A job reached by two nodes counts once per such
	// activation, so this bounds from above the jobs more than one node
	// handled.
	BusyActivations int64   `json:"busy_activations"`
	BusyPerJob      float64 `json:"busy_per_job"`
}

// nodeCosts fills the forwarding cost, each node's figures (one node
// included) from the two snapshots' node counters, and the node ceilings.
func (r *runner) nodeCosts(before, after snapshot) {
	res, n := r.res, float64(r.cfg.Jobs)
	if before.node.Node == nil || after.node.Node == nil {
		return
	}
	d := after.node.Node.sub(*before.node.Node)
	uw := round3(d.UnwrittenWaits / n)
	res.UnwrittenWaitsPerJob = &uw
	res.Forwarding = &ForwardingCost{Taken: int64(d.ForwardTaken), Returned: int64(d.ForwardReturned),
		PerJob:          round3((d.ForwardTaken + d.ForwardReturned) / n),
		BusyActivations: int64(d.Busy), BusyPerJob: round3(d.Busy / n)}
	aParts, bParts := after.node.Parts, before.node.Parts
	if len(aParts) == 0 && r.cfg.Node != NodeExternal && !r.cfg.Adopt {
		// One node: its figures are the run's; its pid is the target's (an
		// adoption replaces the node mid-run: no one node's figures).
		one, prev := after.node, before.node
		one.PID = r.tgt.pid()
		aParts, bParts = []Snap{one}, []Snap{prev}
	}
	if len(aParts) == 0 || len(bParts) != len(aParts) {
		return
	}
	defer r.nodeCeilings()
	for i, a := range aParts {
		b := bParts[i]
		f := NodeFigures{NodeID: a.NodeID,
			RedisCommandsPerJob: round3(float64(a.Redis.Commands-b.Redis.Commands) / n),
			NATSPerJob:          round3(float64(a.NATSIn-b.NATSIn+a.NATSOut-b.NATSOut) / n)}
		if !r.cfg.nodesShareProcess() {
			f.PID = a.PID
			cpu := a.CPU - b.CPU
			f.CPUSec = round3(cpu.Seconds())
			f.CPUSecPer1k = math.Round(cpu.Seconds()/n*1000*1e4) / 1e4
			f.PeakRSSBytes = a.PeakRSS
		}
		if a.Node != nil && b.Node != nil {
			nd := a.Node.sub(*b.Node)
			f.Created, f.Dispatched, f.Completed = int64(nd.Received), int64(nd.Dispatched), int64(nd.Completed)
			f.Forwarded, f.Busy = int64(nd.ForwardTaken+nd.ForwardReturned), int64(nd.Busy)
			f.SubmitsRedelivered, f.SubmitTouches = int64(nd.SubmitsRedelivered), int64(nd.SubmitTouches)
			f.LocksLost = int64(nd.LocksLost)
		}
		res.PerNode = append(res.PerNode, f)
	}
	if !r.cfg.nodesShareProcess() && len(aParts) > 1 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d nodes: node CPU is their sum; peak RSS is the sum of each node's "+
			"own peak (the peaks need not coincide)", len(aParts)))
	}
}

// nodesShareProcess: the nodes run inside the bench process.
func (c *Config) nodesShareProcess() bool { return c.Node == NodeInProcess }
