package bus

// SetOnConcurrentCreate sets the hook ensureStream calls when a create
// loses to a concurrent creator (nil: none).
func SetOnConcurrentCreate(f func(name string)) { onConcurrentCreate = f }
