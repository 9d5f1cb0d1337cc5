package bus

import "time"

// SetOnConcurrentCreate sets the hook ensureStream calls when a create
// loses to a concurrent creator (nil: none).
func SetOnConcurrentCreate(f func(name string)) { onConcurrentCreate = f }

// SetNow sets the keeper's clock (tests).
func (k *StreamKeeper) SetNow(now func() time.Time) { k.now = now }
