package troupe

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/schedule"
	"github.com/troupe-run/troupe/internal/store"
)

// Delayed and scheduled jobs (internal/schedule): the node runs a
// schedule.Ticker, which submits each schedule tick's job and each due
// delayed job on the submit subject like any client, signed as the node
// when signing is on, and the intake holds submits that ask to run later.

// tickerPart runs the ticker as one of the node's components.
func (n *Node) tickerPart() part {
	return part{name: "ticker", start: n.startTicker, stop: func(ctx context.Context) error {
		if n.ticker == nil {
			return nil
		}
		return n.ticker.Stop(ctx)
	}}
}

// startTicker builds the node's ticker, gives the intake its delay hook
// and starts it.
func (n *Node) startTicker(ctx context.Context) error {
	n.ticker = schedule.NewTicker(schedule.Config{
		Store:   schedule.NewStore(n.rdb, n.cfg.KeyPrefix),
		Submit:  n.submitScheduled,
		Log:     n.log,
		Metrics: n.cfg.Metrics,
		Held:    n.alone.AddDelayed, // the renewer part made the index
	})
	n.intake.Delay = n.ticker.Hold
	n.intake.CancelDelayed = n.cancelDelayed
	if err := n.ticker.Start(ctx); err != nil {
		return fmt.Errorf("troupe: %w", err)
	}
	return nil
}

// restoreSchedules writes back, after Redis lost its data (intact: when it
// was last seen whole; zero: unknown), the schedules of the ticker's copy
// that Redis no longer holds. A Redis error is retried a few times.
func (n *Node) restoreSchedules(ctx context.Context, intact time.Time) {
	if n.ticker == nil {
		return
	}
	if intact.IsZero() {
		intact = time.Now()
	}
	for try := 0; try < 5; try++ {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ids, err := n.ticker.Restore(rctx, intact)
		cancel()
		if len(ids) > 0 {
			n.log.Warn("schedules written back after Redis lost its data", "restored", len(ids), "ids", ids[:min(len(ids), 20)])
		}
		if err == nil {
			return
		}
		n.log.Warn("schedules: cannot write them back after Redis lost its data", "err", err, "try", try+1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second << try):
		}
	}
}

// Schedules returns the node's schedule store (valid after Start), for the
// admin API (admin.ScheduleNode).
func (i inspector) Schedules() *schedule.Store {
	if i.ticker == nil {
		return nil
	}
	return i.ticker.Store()
}

// submitScheduled publishes jobs on the submit subject, each with its
// Nats-Msg-Id (a replica submitting the same tick again within the
// stream's duplicate window is dropped by JetStream), and waits for every
// ack.
func (n *Node) submitScheduled(ctx context.Context, jobs []schedule.Job) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sender := n.apiSender("troupe-schedule")
	acks := make([]jetstream.PubAckFuture, 0, len(jobs))
	for _, j := range jobs {
		data, err := bus.EncodeRequest(j.Trace, sender, j.Req)
		if err != nil {
			return err
		}
		msg := &nats.Msg{Subject: n.subj.Submit, Data: data, Header: nats.Header{}}
		msg.Header.Set(jetstream.MsgIDHeader, j.MsgID)
		f, err := n.js.PublishMsgAsync(msg)
		if err != nil {
			return fmt.Errorf("submit %s: %w", j.Req.JobId, err)
		}
		acks = append(acks, f)
	}
	for i, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("submit %s: %w", jobs[i].Req.JobId, err)
		case <-ctx.Done():
			return fmt.Errorf("submit %s: %w", jobs[i].Req.JobId, ctx.Err())
		}
	}
	return nil
}

// cancelDelayed is the intake's CancelDelayed hook: a cancel on the bus of
// a delayed job not yet due removes it (as the admin API's cancel does).
func (n *Node) cancelDelayed(ctx context.Context, jobID string, tenants []string) bool {
	st := n.ticker.Store()
	d, err := st.GetDelayed(ctx, jobID)
	if err != nil || !slices.Contains(tenants, store.AnyTenant) && !slices.Contains(tenants, d.Tenant) {
		return false
	}
	return st.DeleteDelayed(ctx, jobID) == nil
}
