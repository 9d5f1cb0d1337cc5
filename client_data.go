package troupe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/troupe-run/troupe/internal/jobdata"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// SubmitPayload stores payload as req's input where CAP workers read it
// (Redis key ctx:<job_id>, package jobdata), points req's context_ptr at
// it and submits req. A payload over ClientConfig.MaxPayloadBytes is
// ErrTooLarge, and nothing is submitted.
func (c *Client) SubmitPayload(ctx context.Context, req *capv1.JobRequest, payload []byte) error {
	if req.GetJobId() == "" {
		return errors.New("troupe: client: submit needs a job id")
	}
	if req.ContextPtr != "" {
		return errors.New("troupe: client: a payload is the job's context_ptr; the request has one already")
	}
	ptr, err := c.data.PutInput(ctx, req.JobId, payload)
	if err != nil {
		return fmt.Errorf("troupe: client: %w", err)
	}
	req.ContextPtr = ptr
	return c.Submit(ctx, req)
}

// Result returns the bytes of jobID's result where they are kept by CAP's
// Redis convention (the job's own res:<job_id>, its redacted copy, or the
// input an echo pointed back at): ErrNotHeld for a result pointer
// to another store, ErrNotFound when the job has no record. The
// output policy's content scan is not applied: a program reads what its
// own workers wrote (the admin API shows results redacted).
func (c *Client) Result(ctx context.Context, jobID string) ([]byte, error) {
	rec, err := c.store.GetJob(ctx, jobID)
	if err != nil {
		return nil, err
	}
	if rec.ResultPtr == "" {
		return nil, fmt.Errorf("troupe: client: job %s (%s) has no result", jobID, rec.State)
	}
	if rec.State == jobstate.StateOutputQuarantined || !jobdata.OwnedBy(rec.ResultPtr, jobID) {
		return nil, fmt.Errorf("%w: %s", jobdata.ErrNotHeld, rec.ResultPtr)
	}
	return c.data.Get(ctx, rec.ResultPtr)
}

// JobEvent is one state a watched job entered.
type JobEvent struct {
	JobID  string
	State  State
	Reason string
	At     time.Time
	// Record is the job's record as read with this event, set on the
	// terminal event (the last one).
	Record *Job
}

// Watch sends each state jobID enters, in order, from the first, and
// closes the channel after the terminal one or when ctx ends. It reads the
// job's record every ClientConfig.WaitPoll: the record's history lists
// every transition, so none is missed however short, including those the
// nodes decide themselves (a denial, a timeout) that no worker result
// carries. A job with no record yet is waited for; a Redis error is
// retried at the next poll.
func (c *Client) Watch(ctx context.Context, jobID string) <-chan JobEvent {
	out := make(chan JobEvent, 16)
	go func() {
		defer close(out)
		t := time.NewTicker(c.cfg.WaitPoll)
		defer t.Stop()
		sent := 0
		for {
			rec, err := c.store.GetJob(ctx, jobID)
			if err == nil {
				for ; sent < len(rec.History); sent++ {
					h := rec.History[sent]
					ev := JobEvent{JobID: jobID, State: State(h.To), Reason: string(h.Reason), At: h.At}
					last := sent == len(rec.History)-1 && rec.State.Terminal()
					if last {
						ev.Record = jobOf(rec)
					}
					select {
					case out <- ev:
					case <-ctx.Done():
						return
					}
					if last {
						return
					}
				}
				if rec.State.Terminal() {
					return // its history said so already
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return out
}
