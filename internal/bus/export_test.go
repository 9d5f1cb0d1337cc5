package bus

import (
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// SetOnConcurrentCreate sets the hook ensureStream calls when a create
// loses to a concurrent creator (nil: none).
func SetOnConcurrentCreate(f func(name string)) { onConcurrentCreate = f }

// SetNow sets the keeper's clock (tests).
func (k *StreamKeeper) SetNow(now func() time.Time) { k.now = now }

// KeepInProgressEvery is KeepInProgress with its first touch after first
// and the next ones every every (tests: a short redelivery wait).
func KeepInProgressEvery(maxAge, first, every time.Duration, touches *atomic.Uint64) ConsumeOption {
	return func(o *consumeOpts) {
		KeepInProgress(maxAge, touches)(o)
		o.keepFirst, o.keepEvery = first, every
	}
}

// ConsumerConfig is the durable consumer Troupe makes for kind.
func ConsumerConfig(kind StreamKind) jetstream.ConsumerConfig { return consumerConfig(kind) }

// KeeperSlots has Consume report its progress keeper's state room handed
// over so far (the blocks' capacity summed) through *slots when asked.
func KeeperSlots(slots *func() int64) ConsumeOption {
	return func(o *consumeOpts) {
		o.onKeeper = func(k *progressKeeper) { *slots = k.slots.Load }
	}
}

// FastDecoded reports whether Decode decodes data by its own decoder
// (not proto.Unmarshal).
func FastDecoded(data []byte) bool { return fastDecode(data) != nil }

// AppendEnvelope is appendEnvelope (tests).
var AppendEnvelope = appendEnvelope
