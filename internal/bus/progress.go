package bus

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// A node holds a submit un-acked from the moment it fetches it until its
// job's record is written (or the job waits for room within its capacity
// grace, with no record): in the fetch loop's hand-off, the job shards' and
// actors' mailboxes, the store writer's queue. On a loaded machine that can
// pass the consumer's first redelivery wait (RedeliveryBackoff[0], 5 s), and
// JetStream then offers the submit again, to this node or a replica: a
// second activation that finds the job created (or terminal) and costs a
// NATS message and Redis commands for nothing.
//
// The progress keeper (KeepInProgress) prevents that: it tells JetStream
// every fetched message still un-settled (not acked, nak'd or terminated)
// KeepFirst after the fetch that took it is in progress, then every
// KeepEvery, up to its maxAge. At full speed a submit is acked within
// milliseconds and never touched: the keeper's cost per message is a
// progressState (its reply subject and a settled flag, in blocks as large
// as what had arrived in the pull, at most 32: the only thing the keeper
// holds, not the message and its data)
// and one look at that flag when its fetch is due. A node that dies touches nothing, so its submits are offered
// to the survivors within the redelivery wait, as before.
const (
	// KeepFirst is how long after its fetch an un-settled message is first
	// told in progress; KeepEvery how often after that. Both leave the
	// first redelivery wait (5 s) a margin of a tick and more: the fetch's
	// clock starts no later than the message arrives, the server's a
	// little earlier (its delivery, then the client's read). KeepFirst is
	// later than the Toucher's TouchFirst (2 s), whose clock starts at the
	// wait, not the fetch: a submit held 2–3 s is not touched.
	KeepFirst = 3 * time.Second
	KeepEvery = 4 * time.Second
	keepTick  = 250 * time.Millisecond
)

// progressKeeper is the progress keeper of one Consume's fetch loops.
type progressKeeper struct {
	first, every, maxAge, tick time.Duration

	mu      sync.Mutex
	nc      *nats.Conn
	while   func() bool // nil: always; see KeepWhile
	fresh   []keptBatch // in order of fetch: due first+at
	touched []keptMsg   // in order of their next touch
	th      int         // touched's head
	touches *atomic.Uint64
	kick    chan struct{}
	// slots is the states' room handed over (the blocks' capacity), for
	// tests: what the keeper's blocks hold per message.
	slots atomic.Int64
}

// progressState is what the keeper knows of one fetched message: where
// its acknowledgements go and whether it is settled (pulledMsg.reply sets
// it).
type progressState struct {
	reply   string
	settled atomic.Bool
}

// keptBatch is a burst of one fetch's messages, from when it began.
type keptBatch struct {
	at time.Time
	ps []progressState
}

type keptMsg struct {
	ps          *progressState
	next, until time.Time
}

// newProgressKeeper is a keeper whose loop is not started; maxAge ≤ 0: an hour.
func newProgressKeeper(nc *nats.Conn, first, every, maxAge time.Duration) *progressKeeper {
	if maxAge <= 0 {
		maxAge = time.Hour
	}
	return &progressKeeper{nc: nc, first: first, every: every, maxAge: maxAge, tick: min(keepTick, first/4, every/4),
		kick: make(chan struct{}, 1), touches: &atomic.Uint64{}}
}

// add keeps a burst of one fetch's messages (the slice is the keeper's
// from now on: nothing appends to it).
func (k *progressKeeper) add(at time.Time, ps []progressState) {
	if len(ps) == 0 {
		return
	}
	k.slots.Add(int64(cap(ps)))
	k.mu.Lock()
	// In order of at: the fetch loops hand over bursts whose clocks may
	// interleave, and a later one ahead would hold an earlier one back.
	i := len(k.fresh)
	for i > 0 && k.fresh[i-1].at.After(at) {
		i--
	}
	k.fresh = slices.Insert(k.fresh, i, keptBatch{at: at, ps: ps})
	k.mu.Unlock()
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// kept is how many fetches and touched messages the keeper holds.
func (k *progressKeeper) kept() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.fresh) + len(k.touched) - k.th
}

// loop ticks while anything is kept, and sleeps (no timer) while nothing is.
func (k *progressKeeper) loop(ctx context.Context) {
	timer := time.NewTimer(k.tick)
	defer timer.Stop()
	armed := true
	var due []*progressState
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.kick:
			if !armed {
				timer.Reset(k.tick)
				armed = true
			}
		case now := <-timer.C:
			armed = false
			due = k.due(now, due[:0])
			if k.while != nil && !k.while() {
				clear(due) // kept on schedule, not touched: JetStream may offer them again
				due = due[:0]
			}
			for _, ps := range due {
				if !ps.settled.Load() { // settled meanwhile: JetStream would ignore it
					_ = k.nc.Publish(ps.reply, progressBody) // lost: a redelivery, which the job absorbs
					k.touches.Add(1)
				}
			}
			clear(due)
			if k.kept() > 0 {
				timer.Reset(k.tick)
				armed = true
			}
		}
	}
}

// due collects the un-settled messages whose touch is due at now and
// queues their next one; settled messages and those past maxAge are
// dropped. The signals go out after the lock is released.
func (k *progressKeeper) due(now time.Time, out []*progressState) []*progressState {
	k.mu.Lock()
	defer k.mu.Unlock()
	// Touched messages first: the head is the next due (all share one
	// interval, so the queue stays in order of next touch).
	for end := len(k.touched); k.th < end && !now.Before(k.touched[k.th].next); k.th++ {
		e := k.touched[k.th]
		k.touched[k.th] = keptMsg{}
		if e.ps.settled.Load() || now.After(e.until) {
			continue
		}
		e.next = now.Add(k.every)
		k.touched = append(k.touched, e)
		out = append(out, e.ps)
	}
	n := 0
	for ; n < len(k.fresh) && !now.Before(k.fresh[n].at.Add(k.first)); n++ {
		b := k.fresh[n]
		until := b.at.Add(k.maxAge)
		for i := range b.ps {
			ps := &b.ps[i]
			if ps.settled.Load() || now.After(until) {
				continue
			}
			k.touched = append(k.touched, keptMsg{ps: ps, next: now.Add(k.every), until: until})
			out = append(out, ps)
		}
	}
	if n > 0 {
		rest := copy(k.fresh, k.fresh[n:])
		clear(k.fresh[rest:])
		k.fresh = k.fresh[:rest]
	}
	if k.th >= 1024 && k.th*2 >= len(k.touched) || k.th == len(k.touched) {
		rest := copy(k.touched, k.touched[k.th:])
		clear(k.touched[rest:])
		k.touched, k.th = k.touched[:rest], 0
	}
	return out
}
