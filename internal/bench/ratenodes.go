package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sort"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/logx"
)

// RateBucket is the bucket the rate limit runs declare and label their
// jobs with (meta.labels troupe.rate_limit).
const RateBucket = "bench"

// labelRateLimit is the label naming a job's bucket (ratelimit.LabelBucket).
const labelRateLimit = "troupe.rate_limit"

// RateNodesConfig is a rate limit run through real nodes (troupe-bench
// --rate-limit --through-nodes): Nodes `troupe node` replicas (the bench's
// child processes, or inside the bench) with a pools file declaring the
// bucket RateBucket of Rate tokens a second, Workers simulated workers
// answering at once, and Waiting jobs labelled troupe.rate_limit kept
// waiting: each job a worker receives is replaced by a new submit. The run
// counts the jobs dispatched (first receipt by a worker) in each second of
// the measured window and the Redis commands of the window.
type RateNodesConfig struct {
	RedisURL, NATSURL string
	Nodes, Workers    int
	Rate, Waiting     int
	// Duration is the measured window; Warm the time before it (the
	// backlog is submitted and the burst spent).
	Duration, Warm time.Duration
	// Node is NodeChild (ChildCommand runs ServeChild) or NodeInProcess.
	Node         NodeMode
	ChildCommand []string
	// Stderr receives the child nodes' logs (nil: discarded).
	Stderr io.Writer
	// RunID names the run's keys, subjects and streams (empty: random).
	RunID string
	Log   *slog.Logger
}

// RateNodesResult is what a run through real nodes measured.
type RateNodesResult struct {
	Nodes   int     `json:"nodes"`
	Waiting int     `json:"waiting"`
	Limit   int     `json:"limit_per_s"`
	Seconds float64 `json:"seconds"`
	// Dispatched: jobs first received by a worker in the window.
	Dispatched int64   `json:"dispatched"`
	Rate       float64 `json:"dispatched_per_s"`
	ErrorPct   float64 `json:"error_pct"`
	// PerSecond: jobs dispatched in each whole second of the window.
	PerSecond []int64 `json:"dispatched_each_s"`
	MinPerSec int64   `json:"min_per_s"`
	MaxPerSec int64   `json:"max_per_s"`
	// WaitingMin/Max: jobs submitted and not yet dispatched, sampled each
	// second of the window (the backlog the nodes held).
	WaitingMin int64 `json:"waiting_min"`
	WaitingMax int64 `json:"waiting_max"`
	// ServerCommands: INFO commandstats delta over the window (every client
	// of the server, scripts' inner commands included); NodeCommands: the
	// nodes' own clients' commands (a script call counts once).
	ServerCommands     int64            `json:"server_commands"`
	ServerCommandsPerS float64          `json:"server_commands_per_s"`
	ServerTop          map[string]int64 `json:"server_top_commands"`
	NodeCommands       int64            `json:"node_commands"`
	NodeCommandsPerS   float64          `json:"node_commands_per_s"`
	// Duplicates: jobs a worker received more than once (whole run).
	Duplicates int    `json:"duplicates"`
	Load       string `json:"load"`
}

func (r *RateNodesResult) String() string {
	return fmt.Sprintf("rate limit %d/s through %d nodes, %d jobs waiting (held %d..%d): %d dispatched in %.1f s = %.2f/s "+
		"(%+.2f %%), per second min %d max %d; Redis: server %d commands = %.0f/s (top %v), nodes' own %d = %.0f/s; "+
		"duplicates %d; load %s", r.Limit, r.Nodes, r.Waiting, r.WaitingMin, r.WaitingMax, r.Dispatched, r.Seconds, r.Rate,
		r.ErrorPct, r.MinPerSec, r.MaxPerSec, r.ServerCommands, r.ServerCommandsPerS, r.ServerTop, r.NodeCommands,
		r.NodeCommandsPerS, r.Duplicates, r.Load)
}

// RateNodes runs the rate limit bench through real nodes.
func RateNodes(ctx context.Context, c RateNodesConfig) (*RateNodesResult, error) {
	if c.Nodes < 1 || c.Workers < 1 || c.Rate < 1 || c.Waiting < 1 || c.Duration < time.Second {
		return nil, fmt.Errorf("%w: rate limit run needs nodes, workers, limit, waiting ≥ 1 and a window ≥ 1s", ErrConfig)
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Stderr == nil {
		c.Stderr = io.Discard
	}
	if c.RunID == "" {
		c.RunID = newRunID()
	}
	if err := validRunID(c.RunID); err != nil {
		return nil, err
	}
	r := &runner{cfg: Config{Node: c.Node, RunID: c.RunID, ChildCommand: c.ChildCommand, Stderr: c.Stderr},
		pfx: PrefixesFor(c.RunID), log: c.Log}
	r.subj = bus.NewSubjects(r.pfx.Subject)
	var err error
	if r.rdb, r.rc, err = newCountedClient(c.RedisURL); err != nil {
		return nil, fmt.Errorf("bench: redis url: %w", err)
	}
	defer r.teardown() // stops the workers and nodes, deletes the run's keys and streams
	if r.wconn, err = nats.Connect(c.NATSURL, nats.Name("troupe-bench-workers")); err != nil {
		return nil, fmt.Errorf("bench: connect nats %s: %w", logx.RedactURL(c.NATSURL), err)
	}
	if r.sconn, err = nats.Connect(c.NATSURL, nats.Name("troupe-bench-submit")); err != nil {
		return nil, fmt.Errorf("bench: connect nats %s: %w", logx.RedactURL(c.NATSURL), err)
	}
	spec := sutSpec{Role: TargetTroupe, RedisURL: c.RedisURL, NATSURL: c.NATSURL, KeyPrefix: r.pfx.Key,
		SubjectPrefix: r.pfx.Subject, StreamPrefix: r.pfx.Stream, Topic: TopicDefault, Pool: PoolDefault,
		LogLevel: "warn", RateLimit: c.Rate}
	nodes, err := startNodes(ctx, r.cfg, spec, nodeIDs(c.RunID, max(c.Nodes, 2))[:c.Nodes], c.Log)
	if err != nil {
		return nil, err
	}
	r.tgt = nodes

	// Room for the backlog and everything the window and warm-up dispatch,
	// with half again for a faster than declared rate.
	total := c.Waiting + int(1.5*float64(c.Rate)*(c.Warm+c.Duration).Seconds()) + 1000
	r.tr = newTracker(c.RunID+"-", c.RunID+"w-", total)
	if r.fl, err = startFleet(r.wconn, r.subj, c.Workers, PoolDefault, TopicDefault, 0, HeartbeatDefault, 0,
		WorkerDirect, r.tr, 0, 0); err != nil {
		return nil, err
	}
	r.cfg.Workers = c.Workers
	if err := r.waitWorkers(ctx); err != nil {
		return nil, err
	}
	sub, err := newSubmitter(r.sconn, r.subj.Submit, TopicDefault, r.tr, SubmitWindowDefault, 0, 1)
	if err != nil {
		return nil, err
	}
	sub.labels = map[string]string{labelRateLimit: RateBucket}

	// The backlog: a job submitted for each one dispatched, so Waiting stay
	// submitted and not yet received.
	topUp := func(deadline time.Time) error {
		want := min(int64(c.Waiting)+r.tr.received.Load(), int64(total))
		for next := r.tr.submitted.Load(); next < want; next++ {
			if err := sub.publish(int(next), deadline); err != nil {
				return err
			}
		}
		if int64(total) <= r.tr.received.Load()+int64(c.Waiting) {
			return errors.New("bench: the run dispatched more jobs than it made room for (rate far above the limit?)")
		}
		return nil
	}
	end := time.Now().Add(c.Warm + c.Duration + time.Second)
	deadline := end.Add(time.Minute)
	if err := topUp(deadline); err != nil {
		return nil, err
	}
	// Sampled by the same loop: the window's start and end counters, and
	// the backlog once a second.
	var (
		start, stop        time.Time
		srv0, srv1         serverStats
		node0, node1       RedisCounts
		waitMin, waitMax   = int64(math.MaxInt64), int64(0)
		nextSample         time.Time
		snapCommands       = func() RedisCounts { s, _, _ := nodes.snap(ctx); return s.Redis }
		warmEnd            = time.Now().Add(c.Warm)
		tick               = time.NewTicker(20 * time.Millisecond)
		measuring, stopped bool
	)
	defer tick.Stop()
	for !stopped {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		now := time.Now()
		switch {
		case !measuring && !now.Before(warmEnd):
			measuring = true
			srv0, node0 = sumServers(readMasters(ctx, r.rdb)), snapCommands()
			start = time.Now()
			nextSample = start
		case measuring && now.Sub(start) >= c.Duration:
			stop = time.Now()
			srv1, node1 = sumServers(readMasters(ctx, r.rdb)), snapCommands()
			stopped = true
			continue
		}
		if measuring && !now.Before(nextSample) {
			w := r.tr.submitted.Load() - r.tr.received.Load()
			waitMin, waitMax = min(waitMin, w), max(waitMax, w)
			nextSample = nextSample.Add(time.Second)
		}
		if err := topUp(deadline); err != nil {
			return nil, err
		}
	}
	res := &RateNodesResult{Nodes: c.Nodes, Waiting: c.Waiting, Limit: c.Rate, Seconds: stop.Sub(start).Seconds(),
		WaitingMin: waitMin, WaitingMax: waitMax, Load: loadAverage()}
	res.PerSecond = perSecond(r.tr, start, stop)
	res.MinPerSec, res.MaxPerSec = math.MaxInt64, 0
	for _, n := range res.PerSecond {
		res.Dispatched += n
		res.MinPerSec, res.MaxPerSec = min(res.MinPerSec, n), max(res.MaxPerSec, n)
	}
	secs := float64(len(res.PerSecond))
	res.Rate = float64(res.Dispatched) / secs
	res.ErrorPct = 100 * (res.Rate - float64(c.Rate)) / float64(c.Rate)
	calls, n := callsDelta(srv0, srv1)
	res.ServerCommands, res.ServerCommandsPerS, res.ServerTop = n, float64(n)/res.Seconds, topCalls(calls, 6)
	res.NodeCommands = node1.Commands - node0.Commands
	res.NodeCommandsPerS = float64(res.NodeCommands) / res.Seconds
	res.Duplicates, _ = r.tr.duplicates()
	return res, nil
}

// perSecond counts the jobs first received in each whole second from start
// up to stop.
func perSecond(tr *tracker, start, stop time.Time) []int64 {
	secs := int(stop.Sub(start) / time.Second)
	out := make([]int64, secs)
	lo := int64(start.Sub(tr.base))
	for i := range tr.receiptNs {
		ns := tr.receiptNs[i].Load()
		if ns == 0 || ns < lo {
			continue
		}
		if k := int((ns - lo) / int64(time.Second)); k < secs {
			out[k]++
		}
	}
	return out
}

// topCalls keeps the n commands called most.
func topCalls(calls map[string]int64, n int) map[string]int64 {
	names := make([]string, 0, len(calls))
	for k := range calls {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return calls[names[i]] > calls[names[j]] })
	out := map[string]int64{}
	for _, k := range names[:min(n, len(names))] {
		out[k] = calls[k]
	}
	return out
}
