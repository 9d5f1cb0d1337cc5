package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// How the bench learns that jobs are terminal, and when.
//
// Completion is detected by polling the per-state indexes (store.CountIndex:
// 64 ZCARDs in one pipeline) — cheap, and the poll's commands are counted by
// the harness's own client and subtracted from the server's command counts.
// The poll only decides when to stop waiting; it is not the clock. The
// terminal time of each job is the timestamp the node wrote with its terminal
// transition (the history entry, or the record's "updated" field for the
// floor, which keeps no history): unix milliseconds taken by the node when it
// queued the transition into its write pipeline, i.e. at most one pipeline
// round trip before Redis applied it, and truncated to the millisecond. So
// submit → terminal is measured against the node's clock (the same host
// clock as the bench's) with 1 ms resolution, biased low by up to ~1 ms.

// terminalStates other than SUCCEEDED: counted less often, only to stop a run
// that can no longer complete.
var otherTerminal = []jobstate.State{jobstate.StateFailed, jobstate.StateTimeout, jobstate.StateCancelled, jobstate.StateDenied,
	jobstate.StateOutputQuarantined}

// record is what the bench reads back of one job.
type record struct {
	state        jobstate.State
	createdMs    int64
	updatedMs    int64
	dispatchedMs int64 // first DISPATCHED in the history (0: none or not read)
	terminalMs   int64 // terminal transition time (0: not terminal)
}

// recordBatch is the number of jobs read per pipeline.
const recordBatch = 500

// historyMax bounds how many jobs' histories are read (evenly spaced); the
// records themselves are always read for every job.
const historyMax = 50_000

// readRecords reads every job's state, created/updated times and (for up to
// historyMax jobs) history, in pipelines of recordBatch.
func readRecords(ctx context.Context, rdb redis.UniversalClient, keys *store.Keys, ids []string) ([]record, error) {
	out := make([]record, len(ids))
	every := max(1, (len(ids)+historyMax-1)/historyMax)
	for start := 0; start < len(ids); start += recordBatch {
		end := min(start+recordBatch, len(ids))
		pipe := rdb.Pipeline()
		hm := make([]*redis.SliceCmd, end-start)
		all := make([]*redis.MapStringStringCmd, end-start)
		for i := start; i < end; i++ {
			if i%every == 0 {
				all[i-start] = pipe.HGetAll(ctx, keys.Job(ids[i]))
			} else {
				hm[i-start] = pipe.HMGet(ctx, keys.Job(ids[i]), "s", "created", "updated")
			}
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("bench: read job records: %w", err)
		}
		for i := start; i < end; i++ {
			r := &out[i]
			if a := all[i-start]; a != nil {
				f := a.Val()
				r.state = jobstate.State(f["s"])
				r.createdMs, _ = strconv.ParseInt(f["created"], 10, 64)
				r.updatedMs, _ = strconv.ParseInt(f["updated"], 10, 64)
				for _, e := range store.History(f) {
					if e.To == jobstate.StateDispatched && r.dispatchedMs == 0 {
						r.dispatchedMs = e.At.UnixMilli()
					}
					if e.To.Terminal() && r.terminalMs == 0 {
						r.terminalMs = e.At.UnixMilli()
					}
				}
			} else if v := hm[i-start].Val(); len(v) == 3 {
				r.state = jobstate.State(str(v[0]))
				r.createdMs, _ = strconv.ParseInt(str(v[1]), 10, 64)
				r.updatedMs, _ = strconv.ParseInt(str(v[2]), 10, 64)
			}
			if r.updatedMs == 0 { // never changed since its create, which writes none
				r.updatedMs = r.createdMs
			}
			if r.terminalMs == 0 && r.state.Terminal() {
				r.terminalMs = r.updatedMs
			}
		}
	}
	return out, nil
}

func str(v interface{}) string {
	s, _ := v.(string)
	return s
}

// counter polls the per-state indexes for the number of terminal jobs.
type counter struct {
	st        *store.Store
	baseOK    int64 // SUCCEEDED before the measured jobs (warm-up, earlier runs)
	baseOther int64
	other     int64 // last count of other terminal states, above base
	polls     int
}

// otherEvery is how many polls go by between counts of the other terminal
// states (5 more index scans each).
const otherEvery = 20

func (c *counter) baseline(ctx context.Context) error {
	ok, err := c.st.CountIndex(ctx, jobstate.StateSucceeded)
	if err != nil {
		return err
	}
	other, err := c.countOther(ctx)
	if err != nil {
		return err
	}
	c.baseOK, c.baseOther = ok, other
	return nil
}

func (c *counter) countOther(ctx context.Context) (int64, error) {
	counts, err := c.st.CountStates(ctx, otherTerminal...)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, k := range counts {
		n += k
	}
	return n, nil
}

// poll returns succeeded and other-terminal jobs above the baseline.
func (c *counter) poll(ctx context.Context, full bool) (ok, other int64, err error) {
	n, err := c.st.CountIndex(ctx, jobstate.StateSucceeded)
	if err != nil {
		return 0, 0, err
	}
	c.polls++
	if full || c.polls%otherEvery == 0 {
		o, err := c.countOther(ctx)
		if err != nil {
			return 0, 0, err
		}
		c.other = o - c.baseOther
	}
	return n - c.baseOK, c.other, nil
}

// waitCount polls until at least n SUCCEEDED above base, bounded by timeout.
func (c *counter) waitCount(ctx context.Context, n int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, _, err := c.poll(ctx, false)
		if err == nil && ok >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d terminal after %s (last error: %v)", ok, n, timeout, err)
		}
		sleepCtx(ctx, 10*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
