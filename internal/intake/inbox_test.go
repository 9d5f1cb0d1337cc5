package intake

import (
	"bytes"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
)

// settlingShard stands in for a job shard: it reports each event's job id
// and settles its delivery by the id's prefix — "take" acked, "refuse"
// nak'd, anything else ("hold") left unsettled.
type settlingShard struct{ routed chan string }

func (s *settlingShard) Receive(c actor.Context) {
	d, ok := c.Message().(*supervisor.Deliver)
	if !ok {
		return
	}
	var dl jobactor.Delivery
	switch m := d.Msg.(type) {
	case *jobactor.Result:
		dl = m.Delivery
	case *jobactor.Cancel:
		dl = m.Delivery
	}
	switch {
	case strings.HasPrefix(d.JobID, "take"):
		_ = dl.Ack()
	case strings.HasPrefix(d.JobID, "refuse"):
		_ = dl.NakWithDelay(time.Second)
	}
	s.routed <- d.JobID
}

// lockedBuffer is a log sink read by the test while the inbox writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type inboxOwner struct {
	in     *Intake
	subj   bus.Subjects
	nc     *nats.Conn
	routed chan string
	log    *lockedBuffer
}

// newInboxOwner serves node's inbox with a real Intake whose one shard is a
// settlingShard.
func newInboxOwner(t *testing.T, node string) *inboxOwner {
	t.Helper()
	env := testenv.New(t)
	sys := actor.NewActorSystem()
	routed := make(chan string, 64)
	shard := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &settlingShard{routed: routed} }))
	buf := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(buf, nil))
	o := &inboxOwner{subj: bus.NewSubjects(env.Prefix), nc: env.NATS, routed: routed, log: buf,
		in: &Intake{Log: log, Shards: []*actor.PID{shard}, Env: &jobactor.Env{NodeID: node, Log: log, Root: sys.Root}}}
	sub, err := env.NATS.Subscribe(o.subj.Inbox(node), o.in.HandleInbox)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return o
}

// routedIDs reads n job ids the shard was given.
func (o *inboxOwner) routedIDs(t *testing.T, n int) []string {
	t.Helper()
	var ids []string
	for len(ids) < n {
		select {
		case id := <-o.routed:
			ids = append(ids, id)
		case <-time.After(10 * time.Second):
			t.Fatalf("the shard got %v, want %d events", ids, n)
		}
	}
	return ids
}

func resultItem(t *testing.T, id string) supervisor.ForwardItem {
	t.Helper()
	raw, err := bus.EncodeResult("trace-"+id, "w1", &capv1.JobResult{JobId: id, Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED})
	if err != nil {
		t.Fatal(err)
	}
	return supervisor.ForwardItem{Kind: jobactor.ForwardResult, Raw: raw}
}

func cancelItem(t *testing.T, id string) supervisor.ForwardItem {
	t.Helper()
	raw, err := bus.EncodeCancel("trace-"+id, "client", &capv1.JobCancel{JobId: id, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return supervisor.ForwardItem{Kind: jobactor.ForwardCancel, Raw: raw}
}

// A batch is one request; the owner answers each item by its own outcome:
// taken when its actor acked it, refused when nak'd, when the packet does
// not decode, or when its kind is unknown.
func TestInboxBatchAnswersEachItemByItsOutcome(t *testing.T) {
	t.Parallel()
	o := newInboxOwner(t, "owner")
	requests, err := o.nc.SubscribeSync(o.subj.Inbox("owner"))
	if err != nil {
		t.Fatal(err)
	}
	items := []supervisor.ForwardItem{resultItem(t, "take-1"), resultItem(t, "refuse-2"), cancelItem(t, "take-3"),
		{Kind: jobactor.ForwardResult, Raw: []byte{0xff, 0xff, 0xff}}, {Kind: "bogus", Raw: resultItem(t, "take-5").Raw}}
	errs := BatchForwarder(o.nc, o.subj)("owner", items)
	want := []error{nil, errForwardRefused, nil, errForwardRefused, errForwardRefused}
	if !reflect.DeepEqual(errs, want) {
		t.Fatalf("outcomes %v, want %v", errs, want)
	}
	if err := o.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := requests.Pending(); n != 1 {
		t.Fatalf("%d requests on the owner's inbox for a batch of %d, want 1", n, len(items))
	}
	got := o.routedIDs(t, 3)
	if !reflect.DeepEqual(got, []string{"take-1", "refuse-2", "take-3"}) {
		t.Fatalf("the shard got %v", got)
	}
}

// An item its actor never settles is answered refused at the inbox's settle
// bound; the items settled meanwhile are answered as they were settled.
func TestInboxBatchAnswersAtItsSettleBoundWhenAnItemHangs(t *testing.T) {
	t.Parallel()
	o := newInboxOwner(t, "owner")
	o.in.BatchSettle = 200 * time.Millisecond
	errs := BatchForwarder(o.nc, o.subj)("owner", []supervisor.ForwardItem{resultItem(t, "hold-1"), resultItem(t, "take-2")})
	if errs[0] != errForwardRefused || errs[1] != nil {
		t.Fatalf("outcomes %v, want [refused, taken]", errs)
	}
}

// The single form, from a node that does not batch, is still taken and
// answered "ack" / "nak".
func TestInboxStillTakesTheSingleForm(t *testing.T) {
	t.Parallel()
	o := newInboxOwner(t, "owner")
	fwd := Forwarder(o.nc, o.subj)
	take, refuse := resultItem(t, "take-1"), cancelItem(t, "refuse-2")
	if err := fwd("owner", take.Kind, take.Raw); err != nil {
		t.Fatalf("single forward of a taken result: %v", err)
	}
	if err := fwd("owner", refuse.Kind, refuse.Raw); !errors.Is(err, errForwardRefused) {
		t.Fatalf("single forward of a refused cancel: %v, want refused", err)
	}
	if got := o.routedIDs(t, 2); !reflect.DeepEqual(got, []string{"take-1", "refuse-2"}) {
		t.Fatalf("the shard got %v", got)
	}
}

// A batch that does not parse is answered with an error header, logged,
// and nothing of it reaches a shard.
func TestInboxRefusesAMalformedBatch(t *testing.T) {
	t.Parallel()
	o := newInboxOwner(t, "owner")
	good := appendBatch(nil, []supervisor.ForwardItem{resultItem(t, "take-1"), resultItem(t, "take-2")})
	cases := map[string][]byte{
		"empty":               nil,
		"not a batch":         resultItem(t, "take-1").Raw,
		"version":             {batchMagic, 9, 1, 0, 0},
		"no items":            {batchMagic, batchVersion, 0},
		"too many items":      append([]byte{batchMagic, batchVersion}, 0xff, 0xff, 0xff, 0x7f),
		"truncated":           good[:len(good)-3],
		"trailing bytes":      append(append([]byte(nil), good...), 1),
		"length past the end": {batchMagic, batchVersion, 1, 6, 'r', 'e', 's', 'u', 'l', 't', 0x7f, 1},
	}
	for name, data := range cases {
		m := nats.NewMsg(o.subj.Inbox("owner"))
		m.Header.Set(HeaderKind, KindBatch)
		m.Data = data
		reply, err := o.nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if reply.Header.Get(HeaderKind) != KindBatch || reply.Header.Get(HeaderError) == "" || string(reply.Data) != replyNak {
			t.Fatalf("%s: reply %q %v, want a batch reply with %s", name, reply.Data, reply.Header, HeaderError)
		}
		t.Logf("%s: %s", name, reply.Header.Get(HeaderError))
	}
	// The inbox still works, and the first event the shard gets is this one.
	take := resultItem(t, "take-after")
	if err := Forwarder(o.nc, o.subj)("owner", take.Kind, take.Raw); err != nil {
		t.Fatal(err)
	}
	if got := o.routedIDs(t, 1); got[0] != "take-after" {
		t.Fatalf("the shard got %v from malformed batches", got)
	}
	if n := strings.Count(o.log.String(), "forwarded batch refused"); n != len(cases) {
		t.Fatalf("%d refusals logged for %d malformed batches:\n%s", n, len(cases), o.log.String())
	}
}

// An owner that runs the previous code answers a batch as it would any
// packet that does not decode, with a plain "nak" and nothing taken; the
// sender then forwards the events one by one, and keeps to single forwards
// for that owner.
func TestBatchForwarderFallsBackToSinglesForAnOlderOwner(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	subj := bus.NewSubjects(env.Prefix)
	var batches, singles atomic.Int64
	sub, err := env.NATS.Subscribe(subj.Inbox("old"), func(m *nats.Msg) { // the previous HandleInbox, in short
		if _, err := bus.Decode(m.Data); err != nil {
			batches.Add(1)
			_ = m.Respond([]byte(replyNak))
			return
		}
		singles.Add(1)
		_ = m.Respond([]byte(replyAck))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	fwd := BatchForwarder(env.NATS, subj)
	for _, errs := range [][]error{
		fwd("old", []supervisor.ForwardItem{resultItem(t, "a"), cancelItem(t, "b"), resultItem(t, "c")}),
		fwd("old", []supervisor.ForwardItem{resultItem(t, "d"), resultItem(t, "e")}),
	} {
		for i, err := range errs {
			if err != nil {
				t.Fatalf("item %d: %v", i, err)
			}
		}
	}
	if batches.Load() != 1 || singles.Load() != 5 {
		t.Fatalf("the older owner got %d batches and %d single forwards, want 1 and 5", batches.Load(), singles.Load())
	}
}

// No node on the owner's inbox: every item fails with jobactor.ErrOwnerGone.
func TestBatchForwarderOwnerGone(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	errs := BatchForwarder(env.NATS, bus.NewSubjects(env.Prefix))("gone",
		[]supervisor.ForwardItem{resultItem(t, "a"), resultItem(t, "b")})
	for i, err := range errs {
		if !errors.Is(err, jobactor.ErrOwnerGone) {
			t.Fatalf("item %d: %v, want ErrOwnerGone", i, err)
		}
	}
}

// parseBatch reads back what appendBatch wrote, and refuses anything else
// without panicking.
func FuzzParseBatch(f *testing.F) {
	f.Add(appendBatch(nil, []supervisor.ForwardItem{{Kind: "result", Raw: []byte("x")}, {Kind: "cancel"}}))
	f.Add([]byte{batchMagic, batchVersion, 2, 0, 0, 0})
	f.Add([]byte{batchMagic, batchVersion, 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		items, err := parseBatch(data)
		if err != nil {
			return
		}
		again, err := parseBatch(appendBatch(nil, items))
		if err != nil || !reflect.DeepEqual(again, items) {
			t.Fatalf("%x parsed as %d items; written and read again: %v, %v", data, len(items), again, err)
		}
	})
}
