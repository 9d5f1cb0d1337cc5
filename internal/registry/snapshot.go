package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// snapshotVersion is bumped when Entry changes incompatibly; a reader that
// meets another version cold-starts rather than guess.
const snapshotVersion = 1

// Entry is one worker in a registry snapshot: what its last heartbeat said,
// not this node's bookkeeping (dispatch counts are per node and restart at
// zero). Labels and Capabilities share the registry's read-only values.
type Entry struct {
	ID           string            `json:"id"`
	Pool         string            `json:"pool"`
	Region       string            `json:"region,omitempty"`
	Type         string            `json:"type,omitempty"`
	CPULoad      float32           `json:"cpu,omitempty"`
	GPUUtil      float32           `json:"gpu,omitempty"`
	ActiveJobs   int32             `json:"active,omitempty"`
	MaxParallel  int32             `json:"max_parallel,omitempty"`
	Capabilities []string          `json:"caps,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	Direct       bool              `json:"direct,omitempty"`
	// IntervalMS carries the known heartbeat interval, so a hydrated worker
	// keeps its short TTL without relearning it.
	IntervalMS int64 `json:"interval_ms,omitempty"`
}

// Snapshot copies the workers live at now.
func (r *Registry) Snapshot(now time.Time) []Entry {
	out := make([]Entry, 0, len(r.workers))
	for _, w := range r.workers {
		if !r.Live(w, now) {
			continue
		}
		out = append(out, Entry{ID: w.ID, Pool: w.Pool, Region: w.Region, Type: w.Type,
			CPULoad: w.CPULoad, GPUUtil: w.GPUUtil, ActiveJobs: w.ActiveJobs, MaxParallel: w.MaxParallel,
			Capabilities: w.Capabilities, Labels: w.Labels, Direct: w.Direct,
			IntervalMS: w.Interval.Milliseconds()})
	}
	return out
}

// Hydrate adds snapshot entries as if each had just sent a heartbeat
// (last seen = now) and returns how many it added. Workers the registry
// already knows are skipped: a live heartbeat is newer than any snapshot.
// The first real heartbeat after hydration teaches no interval, since the
// time since hydration says nothing about the worker's rhythm.
func (r *Registry) Hydrate(entries []Entry, now time.Time) int {
	n := 0
	for _, e := range entries {
		if e.ID == "" || r.workers[e.ID] != nil {
			continue
		}
		w := newWorker(e.ID)
		w.Pool, w.Region, w.Type = e.Pool, e.Region, e.Type
		w.CPULoad, w.GPUUtil = percent(e.CPULoad), percent(e.GPUUtil)
		w.ActiveJobs, w.MaxParallel = max(e.ActiveJobs, 0), e.MaxParallel
		w.Capabilities, w.Labels, w.Direct = e.Capabilities, e.Labels, e.Direct
		w.Interval, w.LastSeen = time.Duration(e.IntervalMS)*time.Millisecond, now
		w.deadline = now.Add(r.ttlFor(w))
		r.workers[w.ID] = w
		r.attach(w)
		r.rekey(w)
		r.place(w, r.wanted(w))
		n++
	}
	return n
}

// snapshotDoc is the stored form.
type snapshotDoc struct {
	Version   int       `json:"v"`
	Node      string    `json:"node"`
	WrittenAt time.Time `json:"written_at"`
	Workers   []Entry   `json:"workers"`
}

// ErrCorruptSnapshot wraps every reason a stored snapshot cannot be used.
var ErrCorruptSnapshot = errors.New("corrupt registry snapshot")

// EncodeSnapshot serialises entries written by node at at.
func EncodeSnapshot(node string, at time.Time, entries []Entry) ([]byte, error) {
	data, err := json.Marshal(snapshotDoc{Version: snapshotVersion, Node: node, WrittenAt: at, Workers: entries})
	if err != nil {
		return nil, fmt.Errorf("registry: encode snapshot: %w", err)
	}
	return data, nil
}

// Snapshot is a decoded registry snapshot.
type Snapshot struct {
	Node      string
	WrittenAt time.Time
	Workers   []Entry
}

// DecodeSnapshot parses a stored snapshot. Any damage (bad JSON, another
// version, an entry without an id) is an ErrCorruptSnapshot: a
// half-trusted snapshot is worse than a cold start.
func DecodeSnapshot(data []byte) (*Snapshot, error) {
	var doc snapshotDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorruptSnapshot, err)
	}
	if doc.Version != snapshotVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrCorruptSnapshot, doc.Version, snapshotVersion)
	}
	for i, e := range doc.Workers {
		if e.ID == "" {
			return nil, fmt.Errorf("%w: worker %d has no id", ErrCorruptSnapshot, i)
		}
	}
	return &Snapshot{Node: doc.Node, WrittenAt: doc.WrittenAt, Workers: doc.Workers}, nil
}
