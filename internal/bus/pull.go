package bus

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// puller is one fetch loop's way of pulling from a durable consumer: it
// sends JetStream's pull request itself and hands each delivered message to
// the handler on the loop's own goroutine. nats.go's Fetch does the same
// through a goroutine of its own that arms a new timer for every message it
// forwards (a `time.After` in its receive loop) and passes each message on
// through a second channel; at full speed that was 9 % of the node's CPU and
// ~6 allocations per job. Here one timer per loop is reset once per pull.
type puller struct {
	nc      *nats.Conn
	next    string // the consumer's pull (MSG.NEXT) API subject
	timer   *time.Timer
	request []byte
	// keep, when set, is given each pull's messages (KeepInProgress).
	keep *progressKeeper
}

func newPuller(js jetstream.JetStream, stream, consumer string) *puller {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &puller{nc: js.Conn(), next: apiPrefix(js.Options()) + "CONSUMER.MSG.NEXT." + stream + "." + consumer, timer: t}
}

// apiPrefix is the JetStream API prefix a jetstream.JetStream sends its
// requests under: its domain's, its own prefix, or the default.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "" && strings.HasSuffix(o.APIPrefix, "."):
		return o.APIPrefix
	case o.APIPrefix != "":
		return o.APIPrefix + "."
	}
	return jetstream.DefaultAPIPrefix
}

// pullStatusError is a JetStream status that ended a pull early and is
// worth a backoff (the consumer deleted, its leader changed, no responders:
// the stream or JetStream gone).
type pullStatusError struct{ code, description string }

func (e *pullStatusError) Error() string {
	return "bus: pull: status " + e.code + " " + e.description
}

// pull asks the consumer for up to size messages within wait and calls
// handle for each, in arrival order, as it comes. It returns how many it
// handled, and an error if the pull could not be sent or the server ended
// it with a status other than its expiry (408) or "no messages" (404). A
// pull the server never ends (its expiry status lost) ends a second after
// wait. Each pull has its own inbox subscription, as nats.go's Fetch does,
// so that no late message of an earlier pull is counted against this one;
// at full speed that is one subscription per FetchBatch messages.
func (p *puller) pull(ctx context.Context, size int, wait time.Duration, handle func(jetstream.Msg)) (int, error) {
	inbox := p.nc.NewInbox()
	// At most size messages and one status arrive for a pull, so the
	// channel never fills (a full one would make nats.go drop a message).
	ch := make(chan *nats.Msg, size+2)
	sub, err := p.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return 0, fmt.Errorf("bus: pull subscribe: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	p.request = append(p.request[:0], `{"batch":`...)
	p.request = strconv.AppendInt(p.request, int64(size), 10)
	p.request = append(p.request, `,"expires":`...)
	p.request = strconv.AppendInt(p.request, wait.Nanoseconds(), 10)
	p.request = append(p.request, '}')
	if err := p.nc.PublishRequest(p.next, inbox, p.request); err != nil {
		return 0, fmt.Errorf("bus: pull request: %w", err)
	}
	p.timer.Reset(wait + time.Second)
	defer p.timer.Stop()
	// kept is what the progress keeper learns of the messages since at,
	// handed to it whenever the pull would wait for more, when full, and
	// at the pull's end: a message is kept from no later than its arrival.
	var (
		kept []progressState
		at   time.Time
	)
	if p.keep != nil {
		at = time.Now()
		defer func() { p.keep.add(at, kept) }()
	}
	n := 0
	for n < size {
		var m *nats.Msg
		select {
		case m = <-ch: // the common case at full speed: no timer armed
		default:
			if len(kept) > 0 { // p.keep is set
				p.keep.add(at, kept)
				kept, at = nil, time.Now()
			}
			select {
			case m = <-ch:
			case <-p.timer.C:
				return n, nil
			case <-ctx.Done():
				return n, ctx.Err()
			}
		}
		if len(m.Data) == 0 && len(m.Header) > 0 {
			if code := m.Header.Get("Status"); code != "" {
				switch code {
				case "100": // idle heartbeat or flow control
					continue
				case "404", "408": // no messages; the pull expired
					return n, nil
				}
				descr := m.Header.Get("Description")
				if code == "409" {
					d := strings.ToLower(descr)
					if strings.Contains(d, "exceeds maxbytes") || strings.Contains(d, "batch completed") {
						return n, nil
					}
				}
				return n, &pullStatusError{code: code, description: descr}
			}
		}
		n++
		pm := newPulledMsg(m, p.nc)
		if p.keep != nil {
			if len(kept) == cap(kept) {
				// Full (or none yet): a new block, never a grown one, since
				// the messages point into it; as large as what has already
				// arrived (at a low rate a message comes alone, and a block
				// of 32 for it would be 768 bytes held while its job lives).
				p.keep.add(at, kept)
				kept = make([]progressState, 0, min(size-n+1, keptBlock, len(ch)+1))
			}
			kept = append(kept, progressState{reply: m.Reply})
			pm.ps = &kept[len(kept)-1]
		}
		handle(pm)
	}
	return n, nil
}

// Acknowledgement bodies (JetStream's protocol).
var (
	ackBody      = []byte("+ACK")
	nakBody      = []byte("-NAK")
	progressBody = []byte("+WPI")
	termBody     = []byte("+TERM")
)

// pulledMsg is a message a puller received: jetstream.Msg over the
// nats.Msg, acknowledged on its reply subject as nats.go's own message is.
//
// Its metadata is parsed once, as it is received, into the message itself:
// the node reads it up to four times per message (its delivery count, its
// guard key, when it was stored, again at its ack), and a parse of its own,
// or a wrapper caching one, was two allocations per message read.
type pulledMsg struct {
	msg   *nats.Msg
	nc    *nats.Conn
	ackd  atomic.Bool
	md    jetstream.MsgMetadata
	mdErr error
	// ps, when set, is the message's state at a progress keeper, which
	// tells JetStream it is in progress until it is settled
	// (KeepInProgress); set before the message is handled.
	ps *progressState
}

// keptBlock is how many progressStates one allocation holds.
const keptBlock = 32

func newPulledMsg(m *nats.Msg, nc *nats.Conn) *pulledMsg {
	pm := &pulledMsg{msg: m, nc: nc}
	pm.mdErr = pm.parseMetadata(&pm.md)
	return pm
}

// MetadataParsed marks a message whose Metadata is parsed already and
// allocates nothing: intake wraps no cache around it.
func (m *pulledMsg) MetadataParsed() {}

// KeptInProgress reports whether a progress keeper keeps the message in
// progress until it is settled (KeepInProgress): no one else need.
func (m *pulledMsg) KeptInProgress() bool { return m.ps != nil }

func (m *pulledMsg) Data() []byte         { return m.msg.Data }
func (m *pulledMsg) Headers() nats.Header { return m.msg.Header }
func (m *pulledMsg) Subject() string      { return m.msg.Subject }
func (m *pulledMsg) Reply() string        { return m.msg.Reply }

func (m *pulledMsg) Ack() error  { return m.reply(ackBody, true) }
func (m *pulledMsg) Nak() error  { return m.reply(nakBody, true) }
func (m *pulledMsg) Term() error { return m.reply(termBody, true) }

// InProgress may be sent many times; it does not settle the message.
func (m *pulledMsg) InProgress() error { return m.reply(progressBody, false) }

func (m *pulledMsg) NakWithDelay(delay time.Duration) error {
	if delay <= 0 {
		return m.Nak()
	}
	return m.reply(fmt.Appendf(nil, "-NAK {\"delay\": %d}", delay.Nanoseconds()), true)
}

func (m *pulledMsg) TermWithReason(reason string) error {
	if reason == "" {
		return m.Term()
	}
	return m.reply([]byte("+TERM "+reason), true)
}

// DoubleAck acks and waits for the server to confirm it (5 s when ctx has
// no deadline).
func (m *pulledMsg) DoubleAck(ctx context.Context) error {
	if m.msg.Reply == "" {
		return jetstream.ErrMsgNoReply
	}
	if m.ackd.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	if _, err := m.nc.RequestWithContext(ctx, m.msg.Reply, ackBody); err != nil {
		return err
	}
	m.settled()
	return nil
}

// settled marks the message settled, for its keeper too.
func (m *pulledMsg) settled() {
	m.ackd.Store(true)
	if m.ps != nil {
		m.ps.settled.Store(true)
	}
}

func (m *pulledMsg) reply(body []byte, settles bool) error {
	if m.msg.Reply == "" {
		return jetstream.ErrMsgNoReply
	}
	if m.ackd.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	if err := m.nc.Publish(m.msg.Reply, body); err != nil {
		return err
	}
	if settles {
		m.settled()
	}
	return nil
}

// Metadata is the message's metadata, parsed when it was received (the
// same value on every call; callers only read it).
func (m *pulledMsg) Metadata() (*jetstream.MsgMetadata, error) {
	if m.mdErr != nil {
		return nil, m.mdErr
	}
	return &m.md, nil
}

// parseMetadata parses the ack reply subject into md:
// $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ns>.<pending>, or
// with <domain>.<account hash> after $JS.ACK and a token at the end (newer
// servers; domain "_" is none).
func (m *pulledMsg) parseMetadata(md *jetstream.MsgMetadata) error {
	if m.msg.Reply == "" {
		return jetstream.ErrMsgNoReply
	}
	rest, ok := strings.CutPrefix(m.msg.Reply, "$JS.ACK.")
	if !ok {
		return fmt.Errorf("%w: %q", jetstream.ErrNotJSMessage, m.msg.Reply)
	}
	var tok [10]string
	count := 0
	for count < len(tok) {
		var more bool
		tok[count], rest, more = strings.Cut(rest, ".")
		count++
		if !more {
			break
		}
	}
	var t []string
	switch {
	case count == 7: // v1: stream … pending
		t = tok[:7]
	case count >= 9: // v2: domain, account hash, stream … pending[, token]
		t = tok[2:9]
	default:
		return fmt.Errorf("%w: %q", jetstream.ErrNotJSMessage, m.msg.Reply)
	}
	*md = jetstream.MsgMetadata{
		Stream:       t[0],
		Consumer:     t[1],
		NumDelivered: parseUint(t[2]),
		NumPending:   parseUint(t[6]),
		Timestamp:    time.Unix(0, int64(parseUint(t[5]))),
	}
	md.Sequence.Stream = parseUint(t[3])
	md.Sequence.Consumer = parseUint(t[4])
	if count >= 9 && tok[0] != "_" {
		md.Domain = tok[0]
	}
	return nil
}

// parseUint is s's decimal value, 0 if s is not all digits.
func parseUint(s string) uint64 {
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + uint64(c-'0')
	}
	return n
}
