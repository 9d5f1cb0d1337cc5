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
// once. Submits are also held while the node has MaxLiveLocks live locks
// (dispatched jobs whose actors wait out their park-after, and every job in
// between): each is a live actor and a lock every renewal round renews, and
// a node that dispatches long jobs faster than they park would otherwise
// hold as many as its dispatch rate times the park-after (150,000 live
// actors, 470 MiB of live heap, within 12 s of a 500,000-job hold). Cancels
// are not held: they are few, and they end work rather than add it.

// MaxLiveLocks bounds the live (renewed, not parked) job locks of a node
// above which it takes no more submits. Jobs that end or park within the
// park-after never reach it; jobs held longer are dispatched at up to
// MaxLiveLocks per park-after (3,276 per second at the default 10 s).
const MaxLiveLocks = 32768

// behind reports whether the node's lock renewer, or its Writer, is
// behind.
func (in *Intake) behind() bool {
	return in.Env != nil && (in.Env.Renewer != nil && in.Env.Renewer.Late() ||
		in.Env.Writer != nil && in.Env.Writer.Behind())
}

// admission returns the hold function of a fetch loop: hold (nil: none),
// then the admission gate; submits (the submit stream's loop) adds the
// bound on live locks.
func (in *Intake) admission(hold func() bool, submits bool) func() bool {
	return func() bool {
		return (hold != nil && hold()) || in.behind() ||
			submits && in.Env != nil && in.Env.Renewer != nil && in.Env.Renewer.Held() >= MaxLiveLocks
	}
}
