package intake

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/lifecycle"
)

// keptMsg is a message whose fetch loop keeps it in progress (or not).
type keptMsg struct {
	jetstream.Msg
	kept bool
}

func (m keptMsg) KeptInProgress() bool { return m.kept }

// TestGuardedMsgTellsItsKeeper: a guarded delivery answers the Toucher's
// check as its message does, however it was wrapped (Wrap, or deliveryIn's
// wrapper in the caller's block), and a message with no keeper is not kept.
func TestGuardedMsgTellsItsKeeper(t *testing.T) {
	g := &Guard{}
	in := &Intake{Guard: g}
	for _, c := range []struct {
		name string
		msg  jetstream.Msg
		want bool
	}{
		{"kept", keptMsg{kept: true}, true},
		{"not kept", keptMsg{kept: false}, false},
		{"no keeper", lostAck{}, false},
	} {
		var block GuardedMsg
		for how, d := range map[string]jobactor.Delivery{"Wrap": g.Wrap(c.msg), "deliveryIn": in.deliveryIn(c.msg, &block)} {
			gm, ok := d.(*GuardedMsg)
			if !ok {
				t.Fatalf("%s, %s: delivery %T, want *GuardedMsg", c.name, how, d)
			}
			if got := gm.KeptInProgress(); got != c.want {
				t.Errorf("%s, %s: KeptInProgress %v, want %v", c.name, how, got, c.want)
			}
			if got := jobactor.Touches([]lifecycle.Delivery{d}); got == c.want {
				t.Errorf("%s, %s: Touches %v, want %v", c.name, how, got, !c.want)
			}
		}
	}
}
