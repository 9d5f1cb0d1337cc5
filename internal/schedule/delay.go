package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/proto/capv1"
)

// How a client asks for a delayed job: a label on the submit, in CAP's
// JobRequest.meta.labels (or JobRequest.labels), so any CAP client can,
// with no protocol change. meta.labels is the place: JobRequest.labels are
// placement constraints, and the job's own labels the node writes for
// delayed and scheduled jobs (LabelDelayedUntil, LabelSchedule, LabelTick)
// go there too; a run_at / run_after in JobRequest.labels is taken out
// before the job is submitted, so it constrains no placement.
const (
	// LabelRunAt: the time to submit the job at, RFC 3339 ("2026-11-26T18:00:00Z")
	// or unix milliseconds.
	LabelRunAt = "troupe.run_at"
	// LabelRunAfter: a Go duration ("90s", "2h") after the submit entered
	// the submit stream.
	LabelRunAfter = "troupe.run_after"
)

// MaxDelay bounds how far ahead a job may be delayed.
const MaxDelay = 366 * 24 * time.Hour

// Delayed is a submit held until its due time.
type Delayed struct {
	JobID     string    `json:"job_id"`
	TraceID   string    `json:"trace_id,omitempty"`
	Due       time.Time `json:"due"`
	Topic     string    `json:"topic"`
	Tenant    string    `json:"tenant,omitempty"`
	Submitted time.Time `json:"submitted"`
	// Request is the JobRequest, protobuf-encoded.
	Request []byte `json:"request"`

	req *capv1.JobRequest // to encode into Request
}

// DueAt returns when req asks to run, from its labels: ok false when it
// does not ask (or asks for a time at or before stored), an error when a
// label is malformed. stored is when the submit entered the stream.
func DueAt(req *capv1.JobRequest, stored time.Time) (time.Time, bool, error) {
	at, after := label(req, LabelRunAt), label(req, LabelRunAfter)
	var due time.Time
	switch {
	case at != "" && after != "":
		return time.Time{}, false, fmt.Errorf("labels %s and %s: set one", LabelRunAt, LabelRunAfter)
	case at != "":
		if ms, err := strconv.ParseInt(at, 10, 64); err == nil {
			due = time.UnixMilli(ms)
		} else if t, err := time.Parse(time.RFC3339Nano, at); err == nil {
			due = t
		} else {
			return time.Time{}, false, fmt.Errorf("label %s %q: want RFC 3339 or unix milliseconds", LabelRunAt, at)
		}
	case after != "":
		d, err := time.ParseDuration(after)
		if err != nil || d < 0 {
			return time.Time{}, false, fmt.Errorf("label %s %q: want a duration ≥ 0", LabelRunAfter, after)
		}
		due = stored.Add(d)
	default:
		return time.Time{}, false, nil
	}
	// Due times are kept in milliseconds: round up, so that a job is never
	// taken before its time.
	if r := due.Truncate(time.Millisecond); !r.Equal(due) {
		due = r.Add(time.Millisecond)
	}
	if due.Sub(stored) > MaxDelay {
		return time.Time{}, false, fmt.Errorf("delayed by %s: at most %s", due.Sub(stored).Round(time.Second), MaxDelay)
	}
	return due.UTC(), due.After(stored), nil
}

// label returns req's label k, from meta.labels first.
func label(req *capv1.JobRequest, k string) string {
	if v, ok := req.GetMeta().GetLabels()[k]; ok {
		return v
	}
	return req.GetLabels()[k]
}

// delayedOf is req held until due.
func delayedOf(req *capv1.JobRequest, trace string, due, stored time.Time) Delayed {
	return Delayed{JobID: req.JobId, TraceID: trace, Due: due, Topic: req.Topic, Tenant: req.TenantId,
		Submitted: stored.UTC(), req: req}
}

// AddDelayed stores submits to be submitted at their due times, in one
// script. Adding a job id already held keeps the first (a redelivered
// submit); a job id cancelled within CancelledKeep is not held again.
func (st *Store) AddDelayed(ctx context.Context, ds []Delayed) error {
	args := make([]any, 0, 1+3*len(ds))
	args = append(args, time.Now().UnixMilli())
	for _, d := range ds {
		if d.req != nil {
			raw, err := proto.Marshal(d.req)
			if err != nil {
				return err
			}
			d.Request, d.req = raw, nil
		}
		data, err := json.Marshal(d)
		if err != nil {
			return err
		}
		args = append(args, d.JobID, d.Due.UnixMilli(), data)
	}
	return st.addScript.Run(ctx, st.rdb, []string{st.delayDue, st.delayJob, st.delayGone}, args...).Err()
}

// ListDelayed returns up to limit delayed jobs, soonest first (tenant's
// only unless tenant is "").
func (st *Store) ListDelayed(ctx context.Context, tenant string, limit int64) ([]Delayed, error) {
	return st.ListDelayedPage(ctx, tenant, 0, limit, nil)
}

// ListDelayedPage returns up to limit delayed jobs, soonest first, after
// the first skip of those that are tenant's (every tenant's when tenant is
// "") and that keep (when set) keeps. keep sees the job with its Request;
// the jobs returned have none. Bounded: the first 100,000 delayed jobs.
func (st *Store) ListDelayedPage(ctx context.Context, tenant string, skip, limit int64, keep func(*Delayed) bool) ([]Delayed, error) {
	const page = 500
	out := []Delayed{}
	seen := int64(0)
	// Pages of the zset, soonest first; bounded: at most 200 pages.
	for start := int64(0); int64(len(out)) < limit && start < 200*page; start += page {
		ids, err := st.rdb.ZRange(ctx, st.delayDue, start, start+page-1).Result()
		if err != nil {
			return nil, err
		}
		if len(ids) == 0 {
			break
		}
		vals, err := st.rdb.HMGet(ctx, st.delayJob, ids...).Result()
		if err != nil {
			return nil, err
		}
		for _, v := range vals {
			s, ok := v.(string)
			if !ok {
				continue
			}
			var d Delayed
			if json.Unmarshal([]byte(s), &d) != nil || (tenant != "" && d.Tenant != tenant) ||
				(keep != nil && !keep(&d)) {
				continue
			}
			if seen++; seen <= skip {
				continue
			}
			d.Request = nil
			out = append(out, d)
			if int64(len(out)) >= limit {
				break
			}
		}
		if len(ids) < page {
			break
		}
	}
	return out, nil
}

// GetDelayed returns delayed job id.
func (st *Store) GetDelayed(ctx context.Context, id string) (*Delayed, error) {
	v, err := st.rdb.HGet(ctx, st.delayJob, id).Result()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("%w: delayed job %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	d := &Delayed{}
	if err := json.Unmarshal([]byte(v), d); err != nil {
		return nil, err
	}
	return d, nil
}

// QueueDelayedStatus queues on pipe the reads that say whether delayed
// job id is held (in the delayed set, taken or not) and whether it was
// cancelled within CancelledKeep; the returned function answers once pipe
// has run.
func (st *Store) QueueDelayedStatus(ctx context.Context, pipe redis.Pipeliner, id string) func() (held, cancelled bool) {
	h := pipe.HExists(ctx, st.delayJob, id)
	c := pipe.ZScore(ctx, st.delayGone, id)
	return func() (bool, bool) { return h.Val(), c.Err() == nil }
}

// ErrTaken: the delayed job is due and a replica took it to submit; it
// can no longer be cancelled here, only as a job (a cancel mark, or the
// job's cancel once it has a record).
var ErrTaken = errors.New("schedule: delayed job is being submitted")

// DeleteDelayed cancels delayed job id before it is submitted: it never
// runs, and its submit, if the stream delivers it again, is not held
// again. Exactly one of a cancel and the take of its due time wins (one
// script each): ErrTaken once a replica took it, ErrNotFound when no such
// job is held.
func (st *Store) DeleteDelayed(ctx context.Context, id string) error {
	now := time.Now()
	res, err := st.cancelScript.Run(ctx, st.rdb, []string{st.delayDue, st.delayJob, st.delayTaken, st.delayGone},
		id, now.UnixMilli(), now.Add(CancelledKeep).UnixMilli()).Text()
	if err != nil {
		return err
	}
	switch res {
	case "CANCELLED":
		return nil
	case "TAKEN":
		return fmt.Errorf("%w: %s", ErrTaken, id)
	}
	return fmt.Errorf("%w: delayed job %s", ErrNotFound, id)
}

// dropDelayed forgets delayed job id whatever its state (an unreadable
// entry).
func (st *Store) dropDelayed(ctx context.Context, id string) error {
	return st.doneDelayed(ctx, []string{id})
}

// takeDelayed takes up to limit delayed jobs due by upTo, leased until
// leaseEnd.
func (st *Store) takeDelayed(ctx context.Context, upTo, leaseEnd time.Time, limit int) ([]Delayed, error) {
	res, err := st.takeScript.Run(ctx, st.rdb, []string{st.delayDue, st.delayJob, st.delayTaken}, upTo.UnixMilli(),
		leaseEnd.UnixMilli(), limit).StringSlice()
	if err != nil {
		return nil, err
	}
	out := make([]Delayed, 0, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		var d Delayed
		if err := json.Unmarshal([]byte(res[i+1]), &d); err != nil {
			_ = st.dropDelayed(ctx, res[i]) // unreadable: drop it rather than retry forever
			continue
		}
		out = append(out, d)
	}
	return out, nil
}

// doneDelayed forgets delayed jobs once submitted.
func (st *Store) doneDelayed(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	members := make([]any, len(ids))
	for i, id := range ids {
		members[i] = id
	}
	pipe := st.rdb.TxPipeline()
	pipe.ZRem(ctx, st.delayDue, members...)
	pipe.HDel(ctx, st.delayJob, ids...)
	pipe.HDel(ctx, st.delayTaken, ids...)
	_, err := pipe.Exec(ctx)
	return err
}

func sortByID(s []*Schedule) {
	sort.Slice(s, func(i, j int) bool { return strings.Compare(s[i].ID, s[j].ID) < 0 })
}
