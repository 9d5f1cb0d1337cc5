package intake

import (
	"testing"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/testenv"
)

// A subscription that fails (here the inbox, under a node id NATS refuses
// as a subject token) leaves none of the ones made before it behind.
func TestSubscribeFailureLeavesNoSubscription(t *testing.T) {
	env := testenv.New(t)
	before := env.NATS.NumSubscriptions()
	in := &Intake{}
	subs, err := in.Subscribe(env.NATS, bus.NewSubjects(env.Prefix), "bad node id")
	if err == nil {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
		t.Fatal("a node id with spaces was accepted as an inbox subject")
	}
	if n := env.NATS.NumSubscriptions(); n != before {
		t.Fatalf("%d subscriptions left behind after a failed Subscribe (%v)", n-before, err)
	}
}
