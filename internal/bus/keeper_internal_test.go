package bus

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A stream whose limits changed is due a probe until a probe answers, not
// only at the check that saw the change: that check may end before its
// probe gives a verdict (a consumer lookup or the probe timing out under
// load), and the stream would otherwise go unprobed — and be reported
// ready while it refuses every write — until ProbeEvery (seen once in CI:
// TestReadyReportsAStreamThatRefusesWrites, Ready nil 20 s after the
// stream's byte limit shrank to 1).
func TestALimitsChangeKeepsTheProbeDueUntilOneAnswers(t *testing.T) {
	k := NewStreamKeeper(nil, "P", NewSubjects("p"), 1, slog.New(slog.NewTextHandler(io.Discard, nil)))
	now := time.Unix(1_000_000, 0)
	k.now = func() time.Time { return now }
	k.ProbeEvery = time.Hour
	cfg := jetstream.StreamConfig{Name: "P_SUBMIT", MaxBytes: -1}
	if k.limitsChanged(StreamSubmit, cfg) {
		t.Fatal("the first limits seen reported as a change")
	}
	k.probed[StreamSubmit] = now // probed just now, and accepted
	if k.probeDue(StreamSubmit) {
		t.Fatal("a probe due right after one answered")
	}
	cfg.MaxBytes, cfg.Discard = 1, jetstream.DiscardNew
	if !k.limitsChanged(StreamSubmit, cfg) {
		t.Fatal("the byte limit's change not seen")
	}
	// The check that saw the change ended without a verdict; the next
	// one must still probe.
	now = now.Add(time.Second)
	if k.limitsChanged(StreamSubmit, cfg) {
		t.Fatal("the same limits reported as a change again")
	}
	if !k.probeDue(StreamSubmit) {
		t.Fatal("no probe due after the limits changed and no probe answered")
	}
}
