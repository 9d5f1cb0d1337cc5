package lifecycle

import (
	"slices"
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The residency moves, written out independently of lifecycle.moves: a
// failure here means the table changed without this list changing too.
var wantMoves = map[Residency][]Residency{
	Fresh:     {Unwritten, Live, Away, Ended},
	Unwritten: {Fresh},
	Live:      {Fresh, Parked, Away, Ended},
}

func TestEveryResidencyMove(t *testing.T) {
	for from := range numResidencies {
		for to := range numResidencies {
			if got, want := LegalMove(from, to), slices.Contains(wantMoves[from], to); got != want {
				t.Errorf("LegalMove(%s, %s) = %v, want %v", from, to, got, want)
			}
		}
	}
	// A refused move is logged as the simulator's violation and not made.
	d := newDriver(t)
	d.j.in = d
	if d.j.moveTo(Parked) || d.j.res != Fresh {
		t.Fatalf("fresh → parked made: %s", d.j.res)
	}
	if l, ok := find[Log](d.j.fx); !ok || l.Msg != MsgIllegalMove {
		t.Errorf("illegal move not logged as %q: %v", MsgIllegalMove, d.j.fx)
	}
}

// want is one (residency, event) pair's outcome and the residency the job
// is in right after the event.
type want struct {
	o    Outcome
	next Residency
}

// wantOutcomes, written out independently of lifecycle.outcomes, with the
// residency each event leaves the job in at once.
var wantOutcomes = map[Residency][numEventKinds]want{
	Fresh: {EvSubmit: {Create, Fresh}, EvResult: {Activate, Fresh}, EvCancel: {Activate, Fresh},
		EvProgress: {Activate, Fresh}, EvWake: {Activate, Fresh}, EvWorkerLost: {Activate, Fresh},
		EvResultsLost: {Activate, Fresh}, EvAbandon: {Activate, Fresh}, EvTimer: {Handle, Fresh},
		EvPlaced: {Handle, Fresh}, EvLockVanished: {Ignore, Fresh}, EvLockTaken: {Ignore, Fresh},
		EvPolicyBack: {Ignore, Fresh}, EvStopping: {Stop, Fresh}, EvRestarting: {Stop, Fresh}},
	Unwritten: {EvSubmit: {Create, Unwritten}, EvResult: {Retry, Unwritten}, EvCancel: {CreateCancelled, Fresh},
		EvProgress: {Handle, Unwritten}, EvWake: {Ignore, Unwritten}, EvWorkerLost: {Handle, Unwritten},
		EvResultsLost: {Handle, Unwritten}, EvAbandon: {WriteWait, Fresh}, EvTimer: {Handle, Unwritten},
		EvPlaced: {Handle, Fresh}, EvLockVanished: {Ignore, Unwritten}, EvLockTaken: {Ignore, Unwritten},
		EvPolicyBack: {Ignore, Unwritten}, EvStopping: {Stop, Fresh}, EvRestarting: {Stop, Fresh}},
	Live: {EvSubmit: {Absorb, Live}, EvResult: {Handle, Live}, EvCancel: {Handle, Live},
		EvProgress: {Handle, Live}, EvWake: {Ignore, Live}, EvWorkerLost: {Handle, Live},
		EvResultsLost: {Handle, Live}, EvAbandon: {Handle, Live}, EvTimer: {Handle, Live},
		EvPlaced: {Handle, Live}, EvLockVanished: {Handle, Fresh}, EvLockTaken: {Stop, Away},
		EvPolicyBack: {Handle, Live}, EvStopping: {Release, Live}, EvRestarting: {Stop, Live}},
	Parked: {EvSubmit: {Retry, Parked}, EvResult: {Retry, Parked}, EvCancel: {Retry, Parked},
		EvProgress: {PassOn, Parked}, EvWake: {Ignore, Parked}, EvWorkerLost: {PassOn, Parked},
		EvResultsLost: {PassOn, Parked}, EvAbandon: {Ignore, Parked}, EvTimer: {Ignore, Parked},
		EvPlaced: {Ignore, Parked}, EvLockVanished: {Ignore, Parked}, EvLockTaken: {Ignore, Parked},
		EvPolicyBack: {Ignore, Parked}, EvStopping: {Ignore, Parked}, EvRestarting: {Ignore, Parked}},
	Away: {EvSubmit: {Retry, Away}, EvResult: {Retry, Away}, EvCancel: {Retry, Away},
		EvProgress: {Ignore, Away}, EvWake: {Ignore, Away}, EvWorkerLost: {Ignore, Away},
		EvResultsLost: {Ignore, Away}, EvAbandon: {Ignore, Away}, EvTimer: {Ignore, Away},
		EvPlaced: {Ignore, Away}, EvLockVanished: {Ignore, Away}, EvLockTaken: {Ignore, Away},
		EvPolicyBack: {Ignore, Away}, EvStopping: {Ignore, Away}, EvRestarting: {Ignore, Away}},
	Ended: {EvSubmit: {Absorb, Ended}, EvResult: {Absorb, Ended}, EvCancel: {Absorb, Ended},
		EvProgress: {Ignore, Ended}, EvWake: {Ignore, Ended}, EvWorkerLost: {Ignore, Ended},
		EvResultsLost: {Ignore, Ended}, EvAbandon: {Ignore, Ended}, EvTimer: {Ignore, Ended},
		EvPlaced: {Ignore, Ended}, EvLockVanished: {Ignore, Ended}, EvLockTaken: {Ignore, Ended},
		EvPolicyBack: {Ignore, Ended}, EvStopping: {Ignore, Ended}, EvRestarting: {Ignore, Ended}},
}

// into drives a fresh job into residency r (DISPATCHED on w1 where it has a
// record), through the events a node would feed it.
func (d *driver) into(r Residency) {
	d.t.Helper()
	switch r {
	case Fresh:
	case Unwritten:
		if !d.waitUnwritten(&submitDelivery{}) {
			d.t.Fatalf("no wait within the grace: %v", d.fx)
		}
	case Live:
		d.dispatch()
	case Parked:
		d.dispatch()
		d.now = d.j.parkAt
		d.feed(&Timer{Epoch: d.timer})
		d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Parked: true}})
	case Away:
		d.dispatch()
		d.feed(&LockLost{LockValue: d.j.LockValue})
	case Ended:
		d.feed(&Cancel{C: &capv1.JobCancel{JobId: "job-1"}, Delivery: &submitDelivery{}})
		d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateTerminal, State: jobstate.StateSucceeded}})
	}
	if d.j.res != r {
		d.t.Fatalf("driven to %s, want %s (state %s)", d.j.res, r, d.j.State)
	}
}

// event builds an event of kind k for the driven job, with its delivery
// (nil for the kinds that have none).
func (d *driver) event(k EventKind) (any, *submitDelivery) {
	del := &submitDelivery{}
	switch k {
	case EvSubmit:
		return &Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}, Delivery: del}, del
	case EvResult:
		return &Result{Res: &capv1.JobResult{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED,
			WorkerId: "w1"}, Delivery: del, Published: d.now}, del
	case EvCancel:
		return &Cancel{C: &capv1.JobCancel{JobId: "job-1"}, Delivery: del, Published: d.now}, del
	case EvProgress:
		return &Progress{P: &capv1.JobProgress{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_RUNNING},
			From: "w1"}, nil
	case EvWake:
		return &Wake{}, nil
	case EvWorkerLost:
		return &WorkerLost{WorkerID: "w1"}, nil
	case EvResultsLost:
		return &ResultsLost{}, nil
	case EvAbandon:
		return &Abandon{Detail: "actor failed"}, nil
	case EvTimer:
		return &Timer{Epoch: d.timer}, nil
	case EvPlaced:
		return &Placed{JobID: "job-1", Ticket: d.j.ticket,
			Reply: &PickReply{WorkerID: "w2", Subject: "worker.w2.jobs"}}, nil
	case EvLockVanished:
		return &LockLost{LockValue: d.j.LockValue, Vanished: true}, nil
	case EvLockTaken:
		return &LockLost{LockValue: d.j.LockValue}, nil
	case EvPolicyBack:
		return &PolicyBack{}, nil
	case EvStopping:
		return &Stopping{}, nil
	case EvRestarting:
		return &Restarting{}, nil
	}
	d.t.Fatalf("no event of kind %s", k)
	return nil, nil
}

// TestEveryResidencyEvent drives a real job into each residency, feeds it
// each kind of event, and checks the table's outcome against an
// independent list, then that the job did what the outcome says and is in
// the residency the list names.
func TestEveryResidencyEvent(t *testing.T) {
	for r := range numResidencies {
		for k := range numEventKinds {
			w := wantOutcomes[r][k]
			if got := OutcomeOf(r, k); got != w.o {
				t.Errorf("OutcomeOf(%s, %s) = %s, want %s", r, k, got, w.o)
			}
			d := newDriver(t)
			d.into(r)
			ev, del := d.event(k)
			if got, ok := KindOf(ev); !ok || got != k {
				t.Fatalf("KindOf(%T) = %s, %v; want %s", ev, got, ok, k)
			}
			fx := d.feed(ev)
			if err := did(w.o, ev, del, fx); err != "" {
				t.Errorf("%s × %s (%s): %s: %v", r, k, w.o, err, fx)
			}
			if d.j.res != w.next {
				t.Errorf("%s × %s: residency %s after, want %s", r, k, d.j.res, w.next)
			}
		}
	}
}

// did checks that fx is what outcome o does with ev (delivery del, nil for
// none); "" when it is.
func did(o Outcome, ev any, del *submitDelivery, fx []Effect) string {
	w, wrote := find[*Write](fx)
	acked, naked := false, false
	for _, e := range fx {
		switch e := e.(type) {
		case *Ack:
			acked = acked || del != nil && e.D == del
		case Nak:
			naked = naked || del != nil && e.D == del
		}
	}
	_, redelivered := find[Redeliver](fx)
	switch o {
	case Create:
		if _, ok := find[*AskPolicy](fx); !ok && !(wrote && w.Op.Kind == OpClaim) {
			return "the submit was not decided (no policy check, no idempotency claim)"
		}
	case Activate:
		if !wrote || w.Op.Kind != OpActivate || w.Op.Create {
			return "no activation that creates nothing"
		}
	case Absorb:
		if !acked || wrote {
			return "not acked, or written"
		}
	case Retry:
		if !naked || acked || wrote {
			return "not handed back (nak), or acked, or written"
		}
	case PassOn:
		if !redelivered {
			return "not kept for the next actor"
		}
	case CreateCancelled:
		if !wrote || w.Op.Kind != OpActivate || !w.Op.Create || w.Op.T.Final() != jobstate.StateCancelled {
			return "not created CANCELLED"
		}
	case WriteWait:
		if !wrote || w.Op.Kind != OpActivate || !w.Op.Create || w.Op.T.Final() != jobstate.StateScheduled {
			return "the wait was not written (created SCHEDULED)"
		}
	case Ignore:
		for _, e := range fx {
			if m, ok := e.(*ToRouter); ok {
				if t, ok := m.Msg.(*Took); ok && !t.Used {
					continue // a placement refused
				}
			}
			return "something was done"
		}
	case Stop:
		if wrote || acked {
			return "written or acked on a stop"
		}
	case Release:
		if !wrote || w.Epoch != 0 || (w.Op.Kind != OpRelease && (w.Op.T == nil || !w.Op.T.Release)) {
			return "the lock was not released"
		}
	case Handle:
		if naked || redelivered {
			return "handed back or passed on"
		}
		if acked && !wrote {
			if _, ok := ev.(*Submit); !ok {
				return "acked before anything durable"
			}
		}
	}
	return ""
}
