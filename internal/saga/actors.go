package saga

import (
	"context"
	"errors"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// SupervisorName is the saga supervisor's actor name; a workflow's saga
// actor is its child "saga/<workflow_id>".
const SupervisorName = "saga"

// trigger asks the supervisor to roll a workflow back. upToMs is the newest
// trigger score the poller saw for it (unix ms): the rollback clears
// triggers up to that score only.
type trigger struct {
	workflowID string
	upToMs     int64
}

// rollbackDone is the rollback goroutine's last word to its actor.
type rollbackDone struct {
	status Status
	err    error
}

// supervisorActor starts one saga actor per triggered workflow. It keeps
// no state of its own: the actor name is the registry of running sagas
// (SpawnNamed fails with ErrNameExists while one runs), so a trigger
// delivered every poll for a workflow already rolling back costs nothing.
type supervisorActor struct {
	rt *runtime // shared, immutable
}

func supervisorProps(rt *runtime) *actor.Props {
	// A saga actor that panics is stopped, not restarted: its workflow's
	// trigger is still set, so the next poll starts a fresh one that
	// resumes from Redis — the poller is the retry loop.
	stop := actor.NewOneForOneStrategy(1, time.Minute, func(interface{}) actor.Directive { return actor.StopDirective })
	return actor.PropsFromProducer(func() actor.Actor { return &supervisorActor{rt: rt} }, actor.WithSupervisor(stop))
}

func (s *supervisorActor) Receive(c actor.Context) {
	m, ok := c.Message().(*trigger)
	if !ok {
		return
	}
	props := actor.PropsFromProducer(func() actor.Actor {
		return &sagaActor{rt: s.rt, workflowID: m.workflowID, upToMs: m.upToMs}
	})
	if _, err := c.SpawnNamed(props, m.workflowID); err != nil && !errors.Is(err, actor.ErrNameExists) {
		s.rt.cfg.Log.Warn("saga: spawn failed", "workflow_id", m.workflowID, "err", err)
	}
}

// sagaActor drives one workflow's rollback. The rollback itself — a strictly
// sequential run of Redis reads, a publish and up to StepBudget of polling
// per step — runs in one goroutine the actor owns, started on Started and
// cancelled on Stopping; its outcome comes back as a message. Why a goroutine
// rather than one future per call: the steps have no concurrency to gain
// from the actor, each call depends on the previous one, and a 30 s wait
// per step would otherwise be a chain of dozens of continuation messages
// with the same effect. The mailbox stays free, so Stop is honoured at once.
type sagaActor struct {
	// Immutable after construction.
	rt         *runtime
	workflowID string
	upToMs     int64
	// Owned by the actor (touched only in Receive).
	cancel context.CancelFunc
}

func (a *sagaActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		ctx, cancel := context.WithCancel(context.Background())
		a.cancel = cancel
		self, root := c.Self(), c.ActorSystem().Root
		r := &rollback{rt: a.rt, wf: a.workflowID, upToMs: a.upToMs,
			log: a.rt.cfg.Log.With("workflow_id", a.workflowID)}
		a.rt.wg.Add(1)
		go func() {
			defer a.rt.wg.Done()
			st, err := r.run(ctx)
			root.Send(self, &rollbackDone{status: st, err: err})
		}()
	case *rollbackDone:
		switch {
		case m.err == nil && m.status != "":
			a.rt.cfg.Log.Info("saga: rollback finished", "workflow_id", a.workflowID, "status", m.status)
		case m.err != nil && !errors.Is(m.err, errLockHeld) && !errors.Is(m.err, context.Canceled):
			a.rt.cfg.Log.Warn("saga: rollback interrupted; the next poll resumes it",
				"workflow_id", a.workflowID, "err", m.err)
		}
		c.Stop(c.Self())
	case *actor.Stopping, *actor.Restarting:
		if a.cancel != nil {
			a.cancel()
		}
	}
}
