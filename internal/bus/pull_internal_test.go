package bus

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A pulled message's metadata comes from its ack reply subject, in both the
// old form and the newer one with domain, account hash and a last token.
func TestPulledMsgMetadataParsesBothAckSubjectForms(t *testing.T) {
	for _, tc := range []struct{ reply, domain string }{
		{"$JS.ACK.S_SUBMIT.troupe-submit.3.41.17.1732600000000000000.9", ""},
		{"$JS.ACK._.ACCHASH.S_SUBMIT.troupe-submit.3.41.17.1732600000000000000.9.XyZ", ""},
		{"$JS.ACK.hub.ACCHASH.S_SUBMIT.troupe-submit.3.41.17.1732600000000000000.9", "hub"},
	} {
		md, err := newPulledMsg(&nats.Msg{Reply: tc.reply}, nil).Metadata()
		if err != nil {
			t.Fatalf("%s: %v", tc.reply, err)
		}
		want := jetstream.MsgMetadata{Stream: "S_SUBMIT", Consumer: "troupe-submit", NumDelivered: 3, NumPending: 9,
			Timestamp: time.Unix(0, 1732600000000000000), Domain: tc.domain}
		want.Sequence.Stream, want.Sequence.Consumer = 41, 17
		if *md != want {
			t.Fatalf("%s: metadata %+v, want %+v", tc.reply, *md, want)
		}
	}
	for _, bad := range []string{"", "_INBOX.abc", "$JS.ACK.S.c.1.2.3", "$JS.ACK.S.c.1.2.3.4.5.6"} {
		if _, err := newPulledMsg(&nats.Msg{Reply: bad}, nil).Metadata(); err == nil {
			t.Fatalf("reply %q: metadata without an error", bad)
		}
	}
}

// Ack, Nak and Term settle a message once; after that every reply,
// InProgress too, settles nothing and says so.
func TestPulledMsgSettlesOnce(t *testing.T) {
	m := &pulledMsg{msg: &nats.Msg{}}
	if err := m.Ack(); !errors.Is(err, jetstream.ErrMsgNoReply) {
		t.Fatalf("ack without a reply subject: %v", err)
	}
	m.ackd.Store(true)
	for name, f := range map[string]func() error{"ack": m.Ack, "nak": m.Nak, "term": m.Term, "wpi": m.InProgress} {
		m.msg.Reply = "$JS.ACK.S.c.1.2.3.4.5"
		if err := f(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			t.Fatalf("%s after an ack: %v, want ErrMsgAlreadyAckd", name, err)
		}
	}
}

// A pulled message's metadata is parsed as it arrives: reading it again,
// as intake does up to four times per message, allocates nothing.
func TestPulledMsgMetadataReadsAllocateNothing(t *testing.T) {
	m := newPulledMsg(&nats.Msg{Reply: "$JS.ACK.S.c.1.2.3.4.5"}, nil)
	if n := testing.AllocsPerRun(100, func() {
		if md, err := m.Metadata(); err != nil || md.Sequence.Stream != 2 {
			t.Fatalf("metadata %+v, %v", md, err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per metadata read", n)
	}
}

// BenchmarkPulledMsgMetadata alternates, per message received and its
// metadata read four times (as intake does): "wrapped", as before round 4
// of issue 33 (the metadata parsed into a fresh value on the first read and
// kept by a wrapper of intake's), and "inline" (parsed into the message as
// it arrives).
var (
	benchMsg jetstream.Msg
	benchOld *oldPulled
)

// oldPulled is pulledMsg's size before round 4.
type oldPulled struct {
	msg  *nats.Msg
	nc   *nats.Conn
	ackd atomic.Bool
}

func BenchmarkPulledMsgMetadata(b *testing.B) {
	nm := &nats.Msg{Reply: "$JS.ACK.troupe-submit.node.1.123456.123456.1764201600000000000.17"}
	type wrapped struct {
		jetstream.Msg
		md  *jetstream.MsgMetadata
		err error
	}
	var sink uint64
	parser := &pulledMsg{msg: nm}
	for round := 0; round < 2; round++ {
		b.Run("wrapped", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				// The message as it was: no metadata of its own.
				old := &oldPulled{msg: nm}
				md := new(jetstream.MsgMetadata)
				err := parser.parseMetadata(md)
				w := &wrapped{Msg: parser, md: md, err: err}
				benchOld = old
				for r := 0; r < 4; r++ {
					sink += w.md.Sequence.Stream
				}
				benchMsg = w // escapes, as a message handed to intake does
			}
		})
		b.Run("inline", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				var m jetstream.Msg = newPulledMsg(nm, nil)
				for r := 0; r < 4; r++ {
					md, _ := m.Metadata()
					sink += md.Sequence.Stream
				}
				benchMsg = m
			}
		})
	}
	_ = sink
}
