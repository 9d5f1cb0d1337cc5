package intake

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/proto/capv1"
)

// noMeta is a message with no metadata (all divert reads of it here).
type noMeta struct{ jetstream.Msg }

func (noMeta) Metadata() (*jetstream.MsgMetadata, error) { return nil, errors.New("none") }

// TestDivertAsksTheHookOnlyForLabelledSubmits: a submit with no labels is
// never delayed, and the hook is not asked; one with labels of its own or
// in its meta is asked, and what it holds divert reports settled.
func TestDivertAsksTheHookOnlyForLabelledSubmits(t *testing.T) {
	var asked []string
	in := &Intake{Delay: func(req *capv1.JobRequest, _ string, _ time.Time, _ func(error)) (bool, string) {
		asked = append(asked, req.JobId)
		return true, ""
	}}
	for _, c := range []struct {
		req  *capv1.JobRequest
		held bool
	}{
		{&capv1.JobRequest{JobId: "plain"}, false},
		{&capv1.JobRequest{JobId: "meta-no-labels", Meta: &capv1.JobMetadata{}}, false},
		{&capv1.JobRequest{JobId: "own", Labels: map[string]string{"troupe.run_after": "1s"}}, true},
		{&capv1.JobRequest{JobId: "meta", Meta: &capv1.JobMetadata{Labels: map[string]string{"x": "y"}}}, true},
	} {
		if got := in.divert(noMeta{}, c.req, c.req.JobId); got != c.held {
			t.Errorf("%s: divert %v, want %v", c.req.JobId, got, c.held)
		}
	}
	if len(asked) != 2 || asked[0] != "own" || asked[1] != "meta" {
		t.Fatalf("the hook was asked for %v, want [own meta]", asked)
	}
}
