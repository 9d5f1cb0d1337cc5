package intake

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/supervisor"
)

// Batched forwards. A node's Resolver forwards the events of one lock read
// to each owner in one request instead of one request per event (per-request
// cost in nats.go, its reply inbox and locking, was most of a non-owner's
// forwarding CPU). The batch goes to the same subject as a single forward,
// the owner's inbox, marked by HeaderKind "batch"; the owner answers one
// reply with an outcome per item, and the sender settles each event by its
// own item's outcome.
//
// Rolling upgrades. An older node knows only single forwards. A batch's
// body starts with a zero byte, which no protobuf message can start with,
// so an older node's inbox fails to decode it and answers a plain "nak"
// without taking anything; a batch reply always carries HeaderKind "batch",
// so the sender tells the two apart, forwards that batch's events one by
// one, and sends the owner only single forwards for OldOwnerHold before it
// tries a batch again. One subject, not a second one for batches, so NATS
// permissions that let replicas reach each other's inboxes keep working,
// and "no responders" still means that no node, old or new, listens for
// the owner. Every node keeps accepting the single form.

// KindBatch is HeaderKind's value on a batch of forwarded events and on
// the owner's reply to one.
const KindBatch = "batch"

// HeaderError, on a reply to a batch, says why the owner refused the whole
// batch (it did not parse); no item was taken.
const HeaderError = "Troupe-Error"

// Batch framing: batchMagic, batchVersion, then the item count and each
// item's kind and packet, every count and length an unsigned varint. The
// reply's body is one byte per item, in order.
const (
	batchMagic   = 0x00
	batchVersion = 0x01
	itemTaken    = 'a'
	itemRefused  = 'n'
)

// MaxBatchItems bounds the items of one batch an inbox accepts.
const MaxBatchItems = 4096

// BatchSettleDefault bounds how long an owner waits for its actors to settle a
// batch's items before it replies: items not settled by then are answered
// refused (the sender offers them again a second later, as after a single
// forward that timed out), so one slow item holds the others of its batch
// at most this long. Well under ForwardTimeout, the sender's bound.
const BatchSettleDefault = ForwardTimeout / 2

// OldOwnerHold is how long a sender forwards one by one to an owner that
// answered a batch as an older node does.
const OldOwnerHold = time.Minute

// appendBatch frames items as a batch body.
func appendBatch(b []byte, items []supervisor.ForwardItem) []byte {
	b = append(b, batchMagic, batchVersion)
	b = binary.AppendUvarint(b, uint64(len(items)))
	for _, it := range items {
		b = binary.AppendUvarint(b, uint64(len(it.Kind)))
		b = append(b, it.Kind...)
		b = binary.AppendUvarint(b, uint64(len(it.Raw)))
		b = append(b, it.Raw...)
	}
	return b
}

// parseBatch reads a batch body; the items' packets alias data.
func parseBatch(data []byte) ([]supervisor.ForwardItem, error) {
	if len(data) < 2 || data[0] != batchMagic {
		return nil, errors.New("not a forward batch")
	}
	if data[1] != batchVersion {
		return nil, fmt.Errorf("forward batch version %d, want %d", data[1], batchVersion)
	}
	data = data[2:]
	n, k := binary.Uvarint(data)
	if k <= 0 || n == 0 || n > MaxBatchItems {
		return nil, fmt.Errorf("forward batch item count unreadable or out of range (1..%d)", MaxBatchItems)
	}
	data = data[k:]
	field := func() ([]byte, bool) {
		l, k := binary.Uvarint(data)
		if k <= 0 || l > uint64(len(data)-k) {
			return nil, false
		}
		f := data[k : k+int(l)]
		data = data[k+int(l):]
		return f, true
	}
	items := make([]supervisor.ForwardItem, n)
	for i := range items {
		kind, ok := field()
		if !ok {
			return nil, fmt.Errorf("forward batch truncated at item %d of %d", i, n)
		}
		raw, ok := field()
		if !ok {
			return nil, fmt.Errorf("forward batch truncated at item %d of %d", i, n)
		}
		items[i] = supervisor.ForwardItem{Kind: string(kind), Raw: raw}
	}
	if len(data) != 0 {
		return nil, fmt.Errorf("forward batch has %d bytes after its %d items", len(data), n)
	}
	return items, nil
}

// BatchForwarder returns the function a Resolver uses to pass several
// events to one owner: an error per item, nil for each the owner took, as
// Forwarder's for one. Items go in requests of at most about half the
// server's max payload, concurrently; an item too big for one goes alone,
// as a single forward. A batch of one is a single forward.
func BatchForwarder(nc *nats.Conn, subj bus.Subjects) func(owner string, items []supervisor.ForwardItem) []error {
	return BatchForwarderFrom(nc, subj, "")
}

// BatchForwarderFrom is BatchForwarder for node nodeID, signing each
// request as ForwarderFrom does.
func BatchForwarderFrom(nc *nats.Conn, subj bus.Subjects, nodeID string) func(owner string, items []supervisor.ForwardItem) []error {
	single := ForwarderFrom(nc, subj, nodeID)
	f := &batchForwarder{nc: nc, subj: subj, node: nodeID, single: single}
	return f.forward
}

type batchForwarder struct {
	nc     *nats.Conn
	subj   bus.Subjects
	node   string
	single func(owner, kind string, raw []byte) error
	old    sync.Map // owner → time.Time until which it gets single forwards
}

func (f *batchForwarder) forward(owner string, items []supervisor.ForwardItem) []error {
	errs := make([]error, len(items))
	if len(items) == 1 || f.isOld(owner) {
		f.singles(owner, items, errs)
		return errs
	}
	limit := int(f.nc.MaxPayload() / 2)
	if limit <= 0 {
		limit = 512 << 10
	}
	var wg sync.WaitGroup
	start, size := 0, 0
	flush := func(end int) {
		if end-start > 0 {
			part, perr := items[start:end], errs[start:end]
			wg.Add(1)
			go func() { defer wg.Done(); f.request(owner, part, perr) }()
		}
		start, size = end, 0
	}
	for i, it := range items {
		n := len(it.Kind) + len(it.Raw) + 2*binary.MaxVarintLen64
		switch {
		case n > limit: // alone, as a single forward
			flush(i)
			wg.Add(1)
			go func(i int) { defer wg.Done(); errs[i] = f.single(owner, it.Kind, it.Raw) }(i)
			start = i + 1
			continue
		case size+n > limit:
			flush(i)
		}
		size += n
	}
	flush(len(items))
	wg.Wait()
	return errs
}

func (f *batchForwarder) isOld(owner string) bool {
	until, ok := f.old.Load(owner)
	if !ok {
		return false
	}
	if time.Now().Before(until.(time.Time)) {
		return true
	}
	f.old.Delete(owner)
	return false
}

// request sends items as one batch (one item: a single forward) and fills
// errs by the reply.
func (f *batchForwarder) request(owner string, items []supervisor.ForwardItem, errs []error) {
	if len(items) == 1 {
		errs[0] = f.single(owner, items[0].Kind, items[0].Raw)
		return
	}
	m := bus.NewSignedMsg(f.subj.Inbox(owner), f.node, appendBatch(nil, items))
	m.Header.Set(HeaderKind, KindBatch)
	reply, err := f.nc.RequestMsg(m, ForwardTimeout)
	all := func(err error) {
		for i := range errs {
			errs[i] = err
		}
	}
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		all(jobactor.ErrOwnerGone)
	case err != nil:
		all(err)
	case reply.Header.Get(HeaderKind) != KindBatch:
		// An older node: it took nothing (the batch does not decode as a
		// packet); forward one by one.
		f.old.Store(owner, time.Now().Add(OldOwnerHold))
		f.singles(owner, items, errs)
	case reply.Header.Get(HeaderError) != "":
		all(fmt.Errorf("forward: the owner refused the batch: %s", reply.Header.Get(HeaderError)))
	case len(reply.Data) != len(items):
		all(fmt.Errorf("forward: the owner answered %d outcomes for %d events", len(reply.Data), len(items)))
	default:
		for i, o := range reply.Data {
			if o != itemTaken {
				errs[i] = errForwardRefused
			}
		}
	}
}

// singles forwards items one by one, concurrently, so a slow one holds
// no other.
func (f *batchForwarder) singles(owner string, items []supervisor.ForwardItem, errs []error) {
	if len(items) == 1 {
		errs[0] = f.single(owner, items[0].Kind, items[0].Raw)
		return
	}
	var wg sync.WaitGroup
	for i, it := range items {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f.single(owner, it.Kind, it.Raw) }()
	}
	wg.Wait()
}

// inboxBatch collects the outcomes of a forwarded batch's items and
// answers the request once every item is settled, or at its settle bound.
type inboxBatch struct {
	msg     *nats.Msg
	mu      sync.Mutex
	outcome []byte // per item: itemTaken, itemRefused, 0 while unsettled
	left    int
	done    bool
	timer   *time.Timer
}

func (b *inboxBatch) settle(i int, taken bool) {
	b.mu.Lock()
	if b.done || b.outcome[i] != 0 {
		b.mu.Unlock()
		return
	}
	b.outcome[i] = itemRefused
	if taken {
		b.outcome[i] = itemTaken
	}
	b.left--
	if b.left > 0 {
		b.mu.Unlock()
		return
	}
	b.done = true
	t := b.timer
	b.mu.Unlock()
	if t != nil {
		t.Stop()
	}
	b.reply()
}

// expire answers at the settle bound: unsettled items are refused.
func (b *inboxBatch) expire() {
	b.mu.Lock()
	if b.done {
		b.mu.Unlock()
		return
	}
	b.done = true
	for i, o := range b.outcome {
		if o == 0 {
			b.outcome[i] = itemRefused
		}
	}
	b.mu.Unlock()
	b.reply()
}

// reply sends the outcomes; outcome is no longer written once done.
func (b *inboxBatch) reply() {
	r := &nats.Msg{Header: nats.Header{}, Data: b.outcome}
	r.Header.Set(HeaderKind, KindBatch)
	_ = b.msg.RespondMsg(r)
}

// batchItem is one item's delivery: the owner's actor settles it as it
// would a JetStream message.
type batchItem struct {
	b *inboxBatch
	i int
}

func (d batchItem) Ack() error                       { d.b.settle(d.i, true); return nil }
func (d batchItem) NakWithDelay(time.Duration) error { d.b.settle(d.i, false); return nil }
func (d batchItem) InProgress() error                { return nil }

// handleInboxBatch takes a batch of forwarded events: each item is checked
// and routed as a single forward would be; a batch that does not parse is
// answered with HeaderError and nothing of it is taken.
func (in *Intake) handleInboxBatch(msg *nats.Msg) {
	items, err := parseBatch(msg.Data)
	if err != nil {
		in.Log.Warn("forwarded batch refused", "subject", msg.Subject, "bytes", len(msg.Data), "err", err)
		r := &nats.Msg{Header: nats.Header{}, Data: []byte(replyNak)}
		r.Header.Set(HeaderKind, KindBatch)
		r.Header.Set(HeaderError, err.Error())
		_ = msg.RespondMsg(r)
		return
	}
	b := &inboxBatch{msg: msg, outcome: make([]byte, len(items)), left: len(items)}
	b.mu.Lock()
	settle := in.BatchSettle
	if settle <= 0 {
		settle = BatchSettleDefault
	}
	b.timer = time.AfterFunc(settle, b.expire)
	b.mu.Unlock()
	for i, it := range items {
		d := batchItem{b: b, i: i}
		if !in.takeForwarded(it.Kind, it.Raw, d) {
			_ = d.NakWithDelay(0)
		}
	}
}
