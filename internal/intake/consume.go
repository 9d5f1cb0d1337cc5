package intake

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
)

// What the intake listens to: the three work-queue streams through their
// shared durable consumers (any replica may take any message), and three
// core NATS subjects every replica hears (heartbeats, progress) or only this
// one does (its forwarding inbox).

// Subscribe subscribes the intake's core NATS inputs: heartbeats, progress
// and this node's forwarding inbox, subj.Inbox(nodeID). The subscriptions
// are returned in that order; the caller unsubscribes them.
func (in *Intake) Subscribe(nc *nats.Conn, subj bus.Subjects, nodeID string) ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	for _, s := range []struct {
		what, subject string
		handle        nats.MsgHandler
	}{
		{"heartbeats", subj.Heartbeat, in.HandleHeartbeat},
		{"progress", subj.Progress, in.HandleProgress},
		{"inbox", subj.Inbox(nodeID), in.HandleInbox},
	} {
		sub, err := nc.Subscribe(s.subject, s.handle)
		if err != nil {
			// Nothing half-subscribed is left behind.
			for _, done := range subs {
				_ = done.Unsubscribe()
			}
			return nil, fmt.Errorf("subscribe %s: %w", s.what, err)
		}
		subs = append(subs, sub)
	}
	return subs, nil
}

// Consume starts the fetch loops (bus.Consume) of the submit, result and
// cancel streams under prefix, until ctx ends. holdSubmits, when set, pauses
// the submit stream's loop (the node's backpressure), and SubmitRoom, when
// set, bounds each of its fetches (bus.FetchRoom); the admission gate
// (admission.go) pauses the submit and result loops while the node's lock
// renewals or its writes are behind, and the submit loop while it holds
// MaxLiveLocks live locks. opts apply to every loop.
func (in *Intake) Consume(ctx context.Context, js jetstream.JetStream, prefix string, holdSubmits func() bool,
	opts ...bus.ConsumeOption) error {
	submitOpts := opts
	if in.SubmitRoom != nil {
		submitOpts = append(append([]bus.ConsumeOption{}, opts...), bus.FetchRoom(in.SubmitRoom))
	}
	if in.SubmitKeep > 0 {
		submitOpts = append(append([]bus.ConsumeOption{}, submitOpts...), bus.KeepInProgress(in.SubmitKeep, in.SubmitTouches),
			bus.KeepWhile(func() bool { return in.Env == nil || in.Env.Renewer == nil || !in.Env.Renewer.Late() }))
	}
	if err := bus.Consume(ctx, js, prefix, bus.StreamSubmit, in.Log, in.HandleSubmit, in.admission(holdSubmits, true), submitOpts...); err != nil {
		return err
	}
	// The node's own subscription to the result subject first: the shared
	// copies wait for their job's record only once it runs (own.go).
	in.startOwnResults(ctx, js.Conn())
	if err := bus.Consume(ctx, js, prefix, bus.StreamResult, in.Log, in.HandleResult, in.admission(nil, false), opts...); err != nil {
		return err
	}
	return bus.Consume(ctx, js, prefix, bus.StreamCancel, in.Log, in.HandleCancel, nil, opts...)
}
