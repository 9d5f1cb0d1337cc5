package bus_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/testenv"
)

// Attack 7: the input streams had an age limit only, so a flood of
// publishes grew them until the server's disk was full. Each is capped in
// messages and bytes, and refuses new messages when full rather than
// dropping accepted ones.
func TestAttackStreamsAreCappedInMessagesAndBytes(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prefix := env.StreamPrefix()
	if err := bus.EnsureStreams(ctx, js, prefix, bus.NewSubjects(env.Prefix)); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []bus.StreamKind{bus.StreamSubmit, bus.StreamResult, bus.StreamCancel} {
		s, err := js.Stream(ctx, bus.StreamName(prefix, kind))
		if err != nil {
			t.Fatal(err)
		}
		c := s.CachedInfo().Config
		if c.MaxMsgs != bus.StreamMaxMsgs || c.MaxBytes != bus.StreamMaxBytes || c.Discard != jetstream.DiscardNew {
			t.Errorf("stream %s: max_msgs %d, max_bytes %d, discard %v; want %d, %d, new",
				kind, c.MaxMsgs, c.MaxBytes, c.Discard, bus.StreamMaxMsgs, bus.StreamMaxBytes)
		}
	}
}
