package intake

// The admission gate: a node under load renews its job locks before it
// takes more work. While the lock renewer is late (store.LockRenewer.Late:
// some live lock has gone unrenewed for half a lock TTL), the submit and
// result fetch loops pull nothing: new submits and results would add
// activations, locks and writes to a node whose Redis round trips are
// already behind, and its own locks would lapse for them. The messages wait
// in their streams; the fetches resume as soon as a renewal round has
// answered every lock. Likewise while the store's Writer is behind
// (store.Writer.Behind): every message taken then is one more job actor
// waiting in memory for Redis, and a node holding a million jobs whose
// results all arrive at once would otherwise start an actor for each at
// once. Cancels are not held: they are few, and they end work rather than
// add it.

// behind reports whether the node's lock renewer, or its Writer, is
// behind.
func (in *Intake) behind() bool {
	return in.Env != nil && (in.Env.Renewer != nil && in.Env.Renewer.Late() ||
		in.Env.Writer != nil && in.Env.Writer.Behind())
}

// admission returns the hold function of a fetch loop: hold (nil: none),
// then the admission gate.
func (in *Intake) admission(hold func() bool) func() bool {
	return func() bool {
		return (hold != nil && hold()) || in.behind()
	}
}
