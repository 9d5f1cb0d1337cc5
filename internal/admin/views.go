package admin

import (
	"encoding/json"
	"sort"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/jobtrace"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The API's JSON shapes. They are exported so Go clients (the troupe CLI,
// Client) decode exactly what the server encodes.

// Job is GET /v1/jobs/{id}: the record, its history and the decisions
// taken about it.
type Job struct {
	ID           string `json:"id"`
	State        string `json:"state"`
	Topic        string `json:"topic"`
	Tenant       string `json:"tenant"`
	TraceID      string `json:"trace_id,omitempty"`
	Node         string `json:"node,omitempty"`
	Worker       string `json:"worker,omitempty"`
	Subject      string `json:"subject,omitempty"`
	Reason       string `json:"reason,omitempty"`
	ResultPtr    string `json:"result_ptr,omitempty"`
	ErrorCode    string `json:"error_code,omitempty"`
	ErrorMessage string `json:"error_message,omitempty"`
	Attempts     int    `json:"attempts"`
	// QueuePosition: the job waits for room in its pool (SCHEDULED
	// pool_overloaded / no_workers) with this many jobs before it.
	QueuePosition *int `json:"queue_position,omitempty"`
	// Unwritten: the job has no record yet. Either it waits for room
	// within its capacity grace, described from the memory of Node, the
	// replica whose queue holds it, its submit held un-acked in the
	// stream; or it is delayed (RunAt set, reason "delayed"), described
	// from the delayed jobs Redis holds.
	Unwritten bool `json:"unwritten,omitempty"`
	// RunAt: a delayed job (troupe.run_at / troupe.run_after) is submitted
	// then.
	RunAt   *time.Time `json:"run_at,omitempty"`
	Fence   int64      `json:"fence"`
	Created time.Time  `json:"created"`
	Updated time.Time  `json:"updated"`
	// Owner is the lock holder ("<node>|<fence>"), empty when unlocked.
	Owner     string         `json:"owner,omitempty"`
	History   []HistoryEntry `json:"history"`
	Decisions []Decision     `json:"decisions,omitempty"`
	RetryOf   string         `json:"retry_of,omitempty"`
	DLQEntry  string         `json:"dlq_entry,omitempty"`
	Retries   []string       `json:"retries,omitempty"`
	// RetriedAs is the latest of Retries; AttemptList each dispatch.
	RetriedAs   string          `json:"retried_as,omitempty"`
	AttemptList []Attempt       `json:"attempt_list"`
	Request     json.RawMessage `json:"request,omitempty"`
	// Fields is the raw record minus the request bytes.
	Fields map[string]string `json:"fields,omitempty"`
}

// HistoryEntry is one transition.
type HistoryEntry struct {
	At     time.Time `json:"at"`
	From   string    `json:"from,omitempty"`
	To     string    `json:"to"`
	Reason string    `json:"reason"`
	Node   string    `json:"node"`
}

// Decision is one decision about a job: the input policy's, a human's
// approval or rejection, a cancellation.
type Decision struct {
	Kind     string     `json:"kind"` // policy, approval, cancel
	Decision string     `json:"decision,omitempty"`
	By       string     `json:"by,omitempty"`
	Reason   string     `json:"reason,omitempty"`
	RuleID   string     `json:"rule_id,omitempty"`
	Hash     string     `json:"hash,omitempty"`
	At       *time.Time `json:"at,omitempty"`
}

// waitingView is a job waiting for room within its capacity grace: no
// record, no history yet.
func waitingView(w *router.Waiting) Job {
	pos := w.Position
	return Job{ID: w.JobID, State: string(jobstate.StateScheduled), Topic: w.Topic, Tenant: w.Tenant, Node: w.Node,
		Reason: string(w.Reason), QueuePosition: &pos, Unwritten: true, Created: w.Since, Updated: w.Since,
		History: []HistoryEntry{}, AttemptList: []Attempt{}}
}

func jobView(r *store.JobRecord, links store.JobLinks) Job {
	j := Job{ID: r.ID, State: string(r.State), Topic: r.Topic, Tenant: r.Tenant, TraceID: r.TraceID, Node: r.Node,
		Worker: r.Worker, Subject: r.Subject, Reason: string(r.Reason), ResultPtr: r.ResultPtr,
		ErrorCode: r.ErrorCode, ErrorMessage: r.ErrorMessage, Attempts: r.Attempts, Fence: r.Fence,
		Created: r.Created, Updated: r.Updated, Owner: r.LockHolder, History: []HistoryEntry{},
		RetryOf: links.RetryOf, DLQEntry: links.DLQEntry, Retries: links.Retries, Fields: map[string]string{},
		AttemptList: attemptsOf(r)}
	if n := len(links.Retries); n > 0 {
		j.RetriedAs = links.Retries[n-1]
	}
	for _, h := range r.History {
		j.History = append(j.History, HistoryEntry{At: h.At, From: string(h.From), To: string(h.To),
			Reason: string(h.Reason), Node: h.Node})
	}
	f := r.Fields
	for k, v := range f {
		if k != "req" {
			j.Fields[k] = v
		}
	}
	if f["rule_id"] != "" || f["policy_reason"] != "" {
		j.Decisions = append(j.Decisions, Decision{Kind: "policy", Decision: policyOutcome(r), RuleID: f["rule_id"],
			Reason: f["policy_reason"], Hash: f["job_hash"]})
	}
	if d := f["approval_decision"]; d != "" {
		dec := Decision{Kind: "approval", Decision: d, By: f["approval_by"], Reason: f["approval_reason"],
			Hash: f["approval_hash"]}
		if ms, err := strconv.ParseInt(f["approval_at"], 10, 64); err == nil {
			at := time.UnixMilli(ms)
			dec.At = &at
		}
		j.Decisions = append(j.Decisions, dec)
	}
	if by := f["cancelled_by"]; by != "" || f["cancel_reason"] != "" {
		j.Decisions = append(j.Decisions, Decision{Kind: "cancel", Decision: "cancel", By: by, Reason: f["cancel_reason"]})
	}
	if len(r.Request) > 0 {
		req := &capv1.JobRequest{}
		if proto.Unmarshal(r.Request, req) == nil {
			if b, err := (protojson.MarshalOptions{UseProtoNames: true}).Marshal(req); err == nil {
				j.Request = b
			}
		}
	}
	return j
}

// policyOutcome names what the input policy decided, from where the job
// went: a policy decision is recorded only for approval and denial.
func policyOutcome(r *store.JobRecord) string {
	for _, h := range r.History {
		switch {
		case h.To == jobstate.StateApprovalRequired:
			return "require_approval"
		case h.To == jobstate.StateDenied && h.Reason == jobstate.ReasonSafetyDenied:
			return "deny"
		}
	}
	return ""
}

// JobSummary is one line of GET /v1/jobs.
type JobSummary struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	Topic  string `json:"topic"`
	Tenant string `json:"tenant"`
	Reason string `json:"reason,omitempty"`
	Worker string `json:"worker,omitempty"`
	// Labels are the request's labels; Attempts counts its dispatches.
	Labels   map[string]string `json:"labels,omitempty"`
	Attempts int               `json:"attempts"`
	Created  time.Time         `json:"created"`
	Updated  time.Time         `json:"updated"`
	// Unwritten: no record yet: waiting for room within its capacity
	// grace (listed by the nodes), or delayed until RunAt (listed from
	// Redis's delayed jobs, soonest first); both on the pages before the
	// records.
	Unwritten bool       `json:"unwritten,omitempty"`
	RunAt     *time.Time `json:"run_at,omitempty"`
}

// JobList is GET /v1/jobs.
type JobList struct {
	// State is the state listed; "" lists every state.
	State string       `json:"state"`
	Jobs  []JobSummary `json:"jobs"`
	// Next is the cursor of the following page ("" after the last).
	Next string `json:"next,omitempty"`
}

// Submitted answers POST /v1/jobs and POST /v1/dlq/{id}/retry.
type Submitted struct {
	JobID  string `json:"job_id"`
	Tenant string `json:"tenant,omitempty"`
	// Duplicate: a job with this id already existed; the submit was
	// published anyway and the node absorbs it (CAP's at-least-once).
	Duplicate bool   `json:"duplicate,omitempty"`
	State     string `json:"state,omitempty"`
	RetryOf   string `json:"retry_of,omitempty"`
	DLQEntry  string `json:"dlq_entry,omitempty"`
}

// Accepted answers an action that takes effect asynchronously (cancel,
// approve, reject).
type Accepted struct {
	JobID  string `json:"job_id"`
	Action string `json:"action"`
	Note   string `json:"note,omitempty"`
}

// DLQEntry is one line of GET /v1/dlq.
type DLQEntry struct {
	ID         string    `json:"id"`
	At         time.Time `json:"at"`
	JobID      string    `json:"job_id,omitempty"`
	Tenant     string    `json:"tenant,omitempty"`
	Topic      string    `json:"topic,omitempty"`
	Reason     string    `json:"reason"`
	LastReason string    `json:"last_reason,omitempty"`
	Message    string    `json:"message,omitempty"`
	Subject    string    `json:"subject,omitempty"`
	TraceID    string    `json:"trace_id,omitempty"`
	// RawBytes and RawSHA256 are the size and hash of the whole packet
	// (the DLQ keeps only its first store.DLQRawPrefix bytes).
	RawBytes  int    `json:"raw_bytes,omitempty"`
	RawSHA256 string `json:"raw_sha256,omitempty"`
	RetriedAs string `json:"retried_as,omitempty"`
}

// DLQList is GET /v1/dlq.
type DLQList struct {
	Entries []DLQEntry `json:"entries"`
}

func dlqView(e store.DLQEntry, tenant, retriedAs string) DLQEntry {
	return DLQEntry{ID: e.ID, At: e.At, JobID: e.JobID, Tenant: tenant, Topic: e.Topic, Reason: string(e.Reason),
		LastReason: string(e.LastReason), Message: e.Message, Subject: e.Subject, TraceID: e.TraceID,
		RawBytes: int(e.RawSize), RawSHA256: e.RawSHA256, RetriedAs: retriedAs}
}

// Worker is one live worker.
type Worker struct {
	ID         string `json:"id"`
	Pool       string `json:"pool"`
	ActiveJobs int32  `json:"active_jobs"`
	Dispatched int32  `json:"dispatched"`
	InFlight   int32  `json:"in_flight"`
	Steward    string `json:"steward,omitempty"`
	// Unrouted: no topic routes to the worker's pool, so it gets no jobs.
	Unrouted    bool              `json:"unrouted,omitempty"`
	MaxParallel int32             `json:"max_parallel"`
	CPULoad     float32           `json:"cpu_load"`
	GPUUtil     float32           `json:"gpu_util"`
	Direct      bool              `json:"direct"`
	LastSeen    time.Time         `json:"last_seen"`
	Labels      map[string]string `json:"labels,omitempty"`
	// HeartbeatIntervalMS is its heartbeat interval as the node knows it
	// (announced, or learned from its last gaps; absent while unknown);
	// HeartbeatTooSlow: it beats too seldom for the node's worker TTL (its
	// steady interval is over a third of it), so one lost heartbeat gets
	// it evicted or its direct dispatches dropped.
	HeartbeatIntervalMS int64 `json:"heartbeat_interval_ms,omitempty"`
	HeartbeatTooSlow    bool  `json:"heartbeat_too_slow,omitempty"`
	// InFlight is what placement counts (this node's jobs, the other
	// replicas', and any the heartbeat shows beyond them); Dispatched is
	// this node's part. Steward is the replica that places jobs on it.
	// Load is in_flight / max_parallel, 0 when unbounded.
	Load float64 `json:"load"`
}

// PoolLoad sums a pool's live workers.
type PoolLoad struct {
	Pool        string  `json:"pool"`
	Workers     int     `json:"workers"`
	ActiveJobs  int32   `json:"active_jobs"`
	Dispatched  int32   `json:"dispatched"`
	InFlight    int32   `json:"in_flight"`
	MaxParallel int32   `json:"max_parallel"`
	Load        float64 `json:"load"`
}

// WorkerList is GET /v1/workers.
type WorkerList struct {
	Workers []Worker   `json:"workers"`
	Pools   []PoolLoad `json:"pools"`
}

func workerList(ws []router.WorkerInfo) WorkerList {
	out := WorkerList{Workers: []Worker{}, Pools: []PoolLoad{}}
	pools := map[string]*PoolLoad{}
	for _, w := range ws {
		v := Worker{ID: w.ID, Pool: w.Pool, ActiveJobs: w.ActiveJobs, Dispatched: w.Dispatched,
			InFlight: w.InFlight, Steward: w.Steward, Unrouted: !w.Routed,
			MaxParallel: w.MaxParallel, CPULoad: w.CPULoad, GPUUtil: w.GPUUtil, Direct: w.Direct,
			LastSeen: w.LastSeen, Labels: w.Labels, Load: load(w.InFlight, w.MaxParallel),
			HeartbeatIntervalMS: w.Interval.Milliseconds(), HeartbeatTooSlow: w.TooSlow}
		out.Workers = append(out.Workers, v)
		p := pools[w.Pool]
		if p == nil {
			p = &PoolLoad{Pool: w.Pool}
			pools[w.Pool] = p
		}
		p.Workers++
		p.ActiveJobs += w.ActiveJobs
		p.Dispatched += w.Dispatched
		p.InFlight += w.InFlight
		p.MaxParallel += w.MaxParallel
	}
	sort.Slice(out.Workers, func(i, j int) bool {
		a, b := out.Workers[i], out.Workers[j]
		return a.Pool < b.Pool || a.Pool == b.Pool && a.ID < b.ID
	})
	for _, p := range pools {
		p.Load = load(p.InFlight, p.MaxParallel)
		out.Pools = append(out.Pools, *p)
	}
	sort.Slice(out.Pools, func(i, j int) bool { return out.Pools[i].Pool < out.Pools[j].Pool })
	return out
}

func load(busy, max int32) float64 {
	if max <= 0 {
		return 0
	}
	return float64(busy) / float64(max)
}

// TopicMapping is one topic's pools and where the mapping comes from.
type TopicMapping struct {
	Topic string   `json:"topic"`
	Pools []string `json:"pools"`
	// Source is "runtime" (set through the API or `troupe pool`, shared by
	// every replica through Redis), "file" (pools.yaml), or "unmapped" (a
	// paused topic no pool is mapped to).
	Source string `json:"source"`
	// Paused: the topic's jobs are not dispatched; they wait SCHEDULED
	// pool_paused until it is resumed.
	Paused bool `json:"paused"`
}

// Pool is one pool's settings.
type Pool struct {
	Name     string   `json:"name"`
	Requires []string `json:"requires"`
	Dispatch string   `json:"dispatch,omitempty"`
}

// PoolList is GET /v1/pools.
type PoolList struct {
	// Version is the runtime mappings' version (0 before any change).
	Version int64          `json:"version"`
	Topics  []TopicMapping `json:"topics"`
	Pools   []Pool         `json:"pools"`
}

// PoolMapping is the body of PUT /v1/pools/{topic}.
type PoolMapping struct {
	Pools []string `json:"pools"`
}

// Trace is GET /v1/jobs/{id}/trace.
type Trace struct {
	JobID string `json:"job_id"`
	// Tracing says whether this node traces job mailboxes; a trace may
	// still hold entries persisted by other replicas.
	Tracing bool             `json:"tracing"`
	Entries []jobtrace.Entry `json:"entries"`
}

// Stats is GET /v1/stats: what the dashboard polls.
type Stats struct {
	Node string    `json:"node"`
	At   time.Time `json:"at"`
	// States counts jobs per state across the cluster (terminal states:
	// those still retained).
	States map[string]int64 `json:"states"`
	// Counters are this node's own: received, dispatched, and completed
	// per terminal status, since the node started.
	Received      float64            `json:"received"`
	Dispatched    float64            `json:"dispatched"`
	Completed     map[string]float64 `json:"completed"`
	LiveJobActors int                `json:"live_job_actors"`
	// History samples the received and completed counters every
	// ThroughputSampleEvery over the last ThroughputWindow, oldest first.
	History []ThroughputSample `json:"history"`
}

// WhoAmI is GET /v1/whoami.
type WhoAmI struct {
	Tenant string `json:"tenant"`
	Node   string `json:"node"`
}

// Ready is the body of /readyz.
type Ready struct {
	Ready  bool              `json:"ready"`
	Failed map[string]string `json:"failed,omitempty"`
}
