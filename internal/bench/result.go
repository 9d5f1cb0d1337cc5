package bench

import "time"

// Result is everything one run measured; it is written as JSON as is.
type Result struct {
	Target   Target    `json:"target"`
	NodeMode NodeMode  `json:"node_mode"`
	RunID    string    `json:"run_id"`
	Started  time.Time `json:"started"`
	Params   Params    `json:"params"`
	Env      Env       `json:"env"`

	// OK is false when any job did not end SUCCEEDED, any job was received
	// twice, or the run timed out; Failures says why.
	OK       bool     `json:"ok"`
	Failures []string `json:"failures,omitempty"`
	// Notes qualify figures (shared servers, scopes, what was not measured).
	Notes []string `json:"notes,omitempty"`

	Jobs Jobs `json:"jobs"`

	// DurationSec runs from the first submit to the last terminal write.
	DurationSec float64 `json:"duration_s"`
	JobsPerSec  float64 `json:"jobs_per_s"`

	// DispatchMs is submit → first receipt by a worker, both on the bench's
	// monotonic clock.
	DispatchMs Percentiles `json:"dispatch_ms"`
	// SubmitToTerminalMs is submit → the node's terminal write (see observe.go).
	SubmitToTerminalMs Percentiles `json:"submit_to_terminal_ms"`
	// Stages split the path (history timestamps, 1 ms resolution).
	Stages Stages `json:"stages"`

	DispatchHist Histogram `json:"dispatch_hist"`
	TerminalHist Histogram `json:"submit_to_terminal_hist"`
	Timeline     Timeline  `json:"timeline"`

	Node    NodeCost    `json:"node"`
	Redis   RedisCost   `json:"redis"`
	NATS    NATSCost    `json:"nats"`
	Harness HarnessCost `json:"harness"`

	// Hold is set for hold runs (Config.Hold): the in-flight figures.
	Hold *HoldResult `json:"hold,omitempty"`

	// PerWorker is how many requests each simulated worker received.
	PerWorker []int64 `json:"per_worker"`

	// MaxHeld is the most jobs any simulated worker held at once (received,
	// not yet answered) over the measured run.
	MaxHeld int32 `json:"max_held"`
	// Overfills counts the receipts, over the measured run and all workers,
	// that arrived while the worker already held Params.MaxParallel jobs or
	// more (0 when the workers state no limit).
	Overfills int64 `json:"overfills"`
	// Keys is set in the concurrency-key mode (Config.ConcurrencyKeys).
	Keys *KeysResult `json:"keys,omitempty"`
	// CapacityWaitsPerJob is the node's troupe_capacity_waits_total over
	// the measured run per job: how often jobs were written SCHEDULED to
	// wait for room in their pool. Absent when not read (floor, external).
	CapacityWaitsPerJob *float64 `json:"capacity_waits_per_job,omitempty"`
	// UnwrittenWaitsPerJob is the node's troupe_capacity_waits_unwritten_total
	// over the measured run per job: how often jobs waited for room within
	// their capacity grace, with nothing written (a job that outlasts the
	// grace counts in CapacityWaitsPerJob too).
	UnwrittenWaitsPerJob *float64 `json:"unwritten_waits_per_job,omitempty"`

	// Forwarding is what the nodes cost each other: results and cancels
	// passed from the node that fetched them to the node owning their job,
	// and activations that found the job owned elsewhere (0 with one node).
	// Absent when the node's counters are not read (floor, external).
	Forwarding *ForwardingCost `json:"forwarding,omitempty"`
	// PerNode is each node's figures (Troupe target, nodes the bench
	// started): one entry per node, one node included.
	PerNode []NodeFigures `json:"per_node,omitempty"`
	// Ceilings are the jobs/s at which one Redis master, or one node per
	// core, would be saturated at this run's costs.
	Ceilings Ceilings `json:"ceilings"`

	Files Files `json:"files,omitempty"`
}

// Params are the run's inputs.
type Params struct {
	Jobs      int     `json:"jobs"`
	Workers   int     `json:"workers"`
	Rate      float64 `json:"rate_per_s"` // 0 = full speed
	DelayMs   float64 `json:"delay_ms"`
	Warmup    int     `json:"warmup"`
	Topic     string  `json:"topic"`
	Window    int     `json:"submit_window"`
	Heartbeat string  `json:"heartbeat"`
	// MaxParallel is the max_parallel_jobs the workers announce (0: none).
	MaxParallel int32 `json:"max_parallel"`
	// Nodes is how many Troupe nodes ran the jobs (the floor: 1).
	Nodes int `json:"nodes,omitempty"`
	// RedisMasters is how many Redis servers held the data: a cluster's
	// masters, or 1.
	RedisMasters int `json:"redis_masters,omitempty"`
	// WorkerMode is how the simulated workers take jobs (WorkerDirect,
	// WorkerCAP).
	WorkerMode WorkerMode `json:"worker_mode,omitempty"`
}

// Env describes where the run happened.
type Env struct {
	Machine      Machine `json:"machine"`
	RedisVersion string  `json:"redis_version"`
	NATSVersion  string  `json:"nats_version"`
	Git          string  `json:"git,omitempty"`
	// LoadStart and LoadEnd are the machine's load averages (1, 5 and 15
	// minutes, from /proc/loadavg) when the run started and ended: a busy
	// machine shows in them.
	LoadStart string `json:"load_start,omitempty"`
	LoadEnd   string `json:"load_end,omitempty"`
}

// Jobs counts outcomes.
type Jobs struct {
	Submitted int `json:"submitted"`
	// SubmitFailed jobs could not be published.
	SubmitFailed int `json:"submit_failed"`
	Received     int `json:"received"` // distinct jobs a worker received
	Answered     int `json:"answered"`
	Terminal     int `json:"terminal"`
	Succeeded    int `json:"succeeded"`
	NotTerminal  int `json:"not_terminal"`
	// NotSucceeded are terminal in another state.
	NotSucceeded int `json:"not_succeeded"`
	// Duplicates are jobs some worker received more than once.
	Duplicates    int `json:"duplicates"`
	NeverReceived int `json:"never_received"`
	// FinalStates counts every job's state as read back from Redis.
	FinalStates map[string]int `json:"final_states"`
}

// Stages split submit → terminal. Times mix the bench's clock and the node's
// history timestamps (same host clock, 1 ms resolution).
type Stages struct {
	SubmitToRecordMs     Percentiles `json:"submit_to_record_ms"`     // submit → record created (PENDING)
	RecordToDispatchedMs Percentiles `json:"record_to_dispatched_ms"` // → DISPATCHED written
	AnswerToTerminalMs   Percentiles `json:"answer_to_terminal_ms"`   // worker's result publish → terminal written
}

// NodeCost is what the node spent.
type NodeCost struct {
	Scope string `json:"scope"`
	PID   int    `json:"pid,omitempty"`
	// CPUSec over the measured window; CPUSecPer1k = CPUSec / jobs × 1000.
	CPUSec      float64 `json:"cpu_s"`
	CPUSecPer1k float64 `json:"cpu_s_per_1k_jobs"`
	// PeakRSSBytes is the process's VmHWM at the end (its peak since start).
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// IdleCPUPerSec is the node's CPU use with no jobs (CPU-ms per second,
	// read over IdleWindow before the measured jobs): its fixed cost, which
	// dominates CPU per job at low rates.
	IdleCPUMsPerSec float64 `json:"idle_cpu_ms_per_s"`
	// GCs and allocations are the Go runtime's own counts (child and inproc).
	MemMeasured      bool    `json:"mem_measured"`
	GCs              uint32  `json:"gcs"`
	AllocBytesPerJob float64 `json:"alloc_bytes_per_job"`
	MallocsPerJob    float64 `json:"mallocs_per_job"`
	Measured         bool    `json:"measured"`
}

// RedisCost is the Redis traffic of the measured jobs.
type RedisCost struct {
	// Client-side, counted by a go-redis hook on the node's own client
	// (child and inproc modes): commands as sent (EVALSHA = 1) and round
	// trips (a pipeline = 1).
	ClientMeasured       bool               `json:"client_measured"`
	ClientCommandsPerJob float64            `json:"client_commands_per_job"`
	RoundTripsPerJob     float64            `json:"round_trips_per_job"`
	ClientByName         map[string]float64 `json:"client_by_name_per_job,omitempty"`
	// Server-side, from INFO commandstats: includes the commands Lua
	// scripts run; the bench's own commands are subtracted, but any other
	// client of the same server during the run is included.
	ServerMeasured       bool               `json:"server_measured"`
	ServerCommandsPerJob float64            `json:"server_commands_per_job"`
	ServerByName         map[string]float64 `json:"server_by_name_per_job,omitempty"`
	// ServerCPUSecPer1k is Redis's used_cpu_user+sys over the window (summed
	// over a cluster's masters).
	ServerCPUSecPer1k float64 `json:"server_cpu_s_per_1k_jobs"`
	// Masters is each Redis server's share: every master of a Redis
	// Cluster, or the one server (read from each with INFO).
	Masters []RedisMaster `json:"masters,omitempty"`
}

// RedisMaster is one Redis server's work over the measured window: a
// cluster's master, or the single server.
type RedisMaster struct {
	Addr string `json:"addr"`
	// CPUSec is its INFO used_cpu_user + used_cpu_sys delta; CPUSecPer1k
	// the same per 1,000 jobs of the run.
	CPUSec      float64 `json:"cpu_s"`
	CPUSecPer1k float64 `json:"cpu_s_per_1k_jobs"`
	// Commands is its INFO commandstats calls delta over every command
	// (commands Lua scripts run included; INFO itself left out; the bench's
	// own reads included, since they cannot be told apart per master).
	Commands       int64   `json:"commands"`
	CommandsPerJob float64 `json:"commands_per_job"`
	// EvalshaPerJob is its EVALSHA calls per job: how many jobs a script
	// call carries on this master (a job's writes are 2 script runs).
	EvalshaPerJob float64 `json:"evalsha_per_job"`
	// ReadsPerJob is its INFO stats total_reads_processed delta per job:
	// the socket reads it made, about one per round trip a client made
	// (the bench's own INFO reads included).
	ReadsPerJob float64 `json:"reads_per_job"`
	// CeilingJobsPerSec = 1 / (CPU-s per job): the jobs/s at which this
	// master's one thread would be busy all the time (0: no CPU measured).
	CeilingJobsPerSec float64 `json:"ceiling_jobs_per_s,omitempty"`
}

// Ceilings are the throughputs the measured costs imply: the rate at which
// the busiest Redis master, or the busiest node on a core of its own, would
// be saturated. They hold for the share of the work each took in this run.
type Ceilings struct {
	// RedisMasterJobsPerSec = 1 / (Redis CPU-s per job on the busiest
	// master); BusiestMaster names it.
	RedisMasterJobsPerSec float64 `json:"redis_master_jobs_per_s,omitempty"`
	BusiestMaster         string  `json:"busiest_master,omitempty"`
	// NodeCoreJobsPerSec = 1 / (CPU-s per job of the busiest node): the
	// jobs/s at which it would fill one core (one node per core). Only where
	// each node's CPU is its own (child processes).
	NodeCoreJobsPerSec float64 `json:"node_core_jobs_per_s,omitempty"`
	BusiestNode        string  `json:"busiest_node,omitempty"`
	// NodesBalancedJobsPerSec = nodes / (all nodes' CPU-s per job): where
	// the nodes would fill one core each if they shared the work evenly.
	NodesBalancedJobsPerSec float64 `json:"nodes_balanced_jobs_per_s,omitempty"`
	// SystemCPUSecPer1k is the whole system's CPU per 1,000 jobs: the
	// nodes', Redis's (all masters), nats-server's and the harness's, where
	// all four were read (a child node, Redis INFO, a local nats-server);
	// MachineJobsPerSec = this host's CPUs / it: the jobs/s at which they
	// would all be busy, when everything runs on this host.
	SystemCPUSecPer1k float64 `json:"system_cpu_s_per_1k_jobs,omitempty"`
	MachineJobsPerSec float64 `json:"machine_jobs_per_s,omitempty"`
}

// NATSCost counts NATS messages on the client side (the system NATS has no
// monitoring port): every message each connection sent or received.
type NATSCost struct {
	NodeMeasured   bool    `json:"node_measured"`
	NodeInPerJob   float64 `json:"node_in_per_job"`
	NodeOutPerJob  float64 `json:"node_out_per_job"`
	BenchInPerJob  float64 `json:"bench_in_per_job"`
	BenchOutPerJob float64 `json:"bench_out_per_job"`
	TotalPerJob    float64 `json:"total_per_job"`
	// ServerCPUSecPer1k is the CPU of the nats-server the bench talks to:
	// the local process listening on the URL's port (listenerPID), else the
	// only nats-server on this host; absent when neither is found.
	ServerCPUSecPer1k float64 `json:"server_cpu_s_per_1k_jobs,omitempty"`
}

// HarnessCost is the bench process's own CPU (with an in-process node, it
// includes the node).
type HarnessCost struct {
	CPUSecPer1k float64 `json:"cpu_s_per_1k_jobs"`
}

// Files are the outputs written for the run.
type Files struct {
	JSON       string `json:"json,omitempty"`
	CPUProfile string `json:"cpu_profile,omitempty"`
}

// Comparison is a Troupe run and a floor run from the same invocation.
type Comparison struct {
	Troupe *Result `json:"troupe"`
	Floor  *Result `json:"floor"`
	// OfFloor is Troupe's throughput as a fraction of the floor's.
	OfFloor float64 `json:"of_floor"`
}

// KeysResult is what the workers counted per concurrency key, all workers
// together, over the measured run, and the makespan against the ideal.
type KeysResult struct {
	Keys  int `json:"keys"`
	Limit int `json:"limit"`
	// MaxHeld is the most jobs of one key held at once (received, not yet
	// answered) by the workers together.
	MaxHeld int32 `json:"max_held"`
	// Overfills counts the receipts that found their key's jobs already
	// held at the limit or more: each is a job over its key's limit.
	Overfills int64 `json:"overfills"`
	// IdealMakespanSec is Config.IdealMakespan: ceil(jobs/(keys×limit)) ×
	// delay. The makespan is Result.DurationSec (first submit → last
	// terminal write); OverIdealPct is how far above the ideal it is.
	IdealMakespanSec float64 `json:"ideal_makespan_s"`
	OverIdealPct     float64 `json:"over_ideal_pct"`
	// Gaps: from a worker's answer to a job of a key to the next receipt
	// of a job of that key (a slot handed on), in ms: how many, mean,
	// p50, p90, p99, max.
	Gaps      int     `json:"gaps"`
	GapMeanMs float64 `json:"gap_mean_ms"`
	GapP50Ms  float64 `json:"gap_p50_ms"`
	GapP90Ms  float64 `json:"gap_p90_ms"`
	GapP99Ms  float64 `json:"gap_p99_ms"`
	GapMaxMs  float64 `json:"gap_max_ms"`
	// LateGaps, LateGapMeanMs: those of receipts 20 s or more into the
	// run (past the submit burst).
	LateGaps      int     `json:"late_gaps"`
	LateGapMeanMs float64 `json:"late_gap_mean_ms"`
}
