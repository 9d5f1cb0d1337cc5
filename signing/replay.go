package signing

import (
	"encoding/asn1"
	"math/big"
	"sync"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// Replay window reasons (labels of troupe_packets_rejected_total).
const (
	// ReasonStale: created_at is missing or further than the window's skew
	// from when the packet arrived.
	ReasonStale Reason = "stale"
	// ReasonReplayed: the packet's signature was taken already within the
	// window.
	ReasonReplayed Reason = "replayed"
)

// Replay window defaults.
const (
	DefaultReplaySkew = 5 * time.Minute
	DefaultReplaySeen = 200_000
)

// ReplayGuard refuses a signed packet whose created_at is more than Skew
// from its arrival, and one whose signature it has taken already: within
// the skew a captured packet passes the time check, so the guard remembers
// every signature it took until its created_at leaves the window. It is
// per process; see SECURITY.md for what that means with replicas.
//
// A signature is remembered by its r value. ECDSA signatures are
// malleable (r, s) and (r, n−s) both verify, so keying on the whole
// signature would let a replayer re-encode it; r alone comes from the
// signer's per-signature nonce and identifies the signing.
//
// The seen-set holds at most Max entries; beyond that the oldest is
// forgotten (counted by Forgotten): a flood of signed packets from a key
// holder could then push a signature out early. Safe for concurrent use.
type ReplayGuard struct {
	skew time.Duration
	max  int

	mu        sync.Mutex
	seen      map[string]seenSig
	order     []string // FIFO of keys in arrival order (ring over a slice)
	head      int
	forgotten uint64
}

type seenSig struct {
	seq     uint64
	expires time.Time
}

// NewReplayGuard returns a guard with the given skew (0: DefaultReplaySkew)
// and seen-set bound (0: DefaultReplaySeen).
func NewReplayGuard(skew time.Duration, max int) *ReplayGuard {
	if skew <= 0 {
		skew = DefaultReplaySkew
	}
	if max <= 0 {
		max = DefaultReplaySeen
	}
	return &ReplayGuard{skew: skew, max: max, seen: map[string]seenSig{}}
}

// Skew returns the guard's window: how far created_at may be from arrival.
func (g *ReplayGuard) Skew() time.Duration { return g.skew }

// Fresh checks the time alone: created is within the skew of arrived.
func (g *ReplayGuard) Fresh(created, arrived time.Time) bool {
	if created.IsZero() {
		return false
	}
	d := arrived.Sub(created)
	return d <= g.skew && d >= -g.skew
}

// Check takes a verified packet that arrived at arrived (for a JetStream
// message: when the stream stored it, which a redelivery keeps, so a packet
// waiting in the stream through an outage is not stale; for core NATS:
// now). seq identifies the delivery's message (its stream sequence): the
// same signature under the same non-zero seq is a redelivery, not a
// replay. It returns "" when the packet is taken, ReasonStale or
// ReasonReplayed otherwise.
func (g *ReplayGuard) Check(pkt *capv1.BusPacket, arrived time.Time, seq uint64) Reason {
	ts := pkt.GetCreatedAt()
	if ts == nil || !ts.IsValid() {
		return ReasonStale
	}
	created := ts.AsTime()
	if !g.Fresh(created, arrived) {
		return ReasonStale
	}
	key := sigKey(pkt.GetSignature())
	if key == "" {
		return "" // unsigned: nothing to remember (verification decides)
	}
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if s, ok := g.seen[key]; ok && now.Before(s.expires) {
		if seq != 0 && s.seq == seq {
			return ""
		}
		return ReasonReplayed
	}
	g.expire(now)
	g.remember(key, seenSig{seq: seq, expires: created.Add(g.skew)})
	return ""
}

// Forgotten returns how many signatures were forgotten before their
// window ended because the seen-set was full.
func (g *ReplayGuard) Forgotten() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.forgotten
}

// Len returns how many signatures the guard remembers.
func (g *ReplayGuard) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.seen)
}

// expire drops entries from the front of the FIFO whose window ended. The
// FIFO is in arrival order, not expiry order, so it stops at the first
// live entry; a later expired one goes when it reaches the front (bounded
// by max either way).
func (g *ReplayGuard) expire(now time.Time) {
	for g.head < len(g.order) {
		k := g.order[g.head]
		if s, ok := g.seen[k]; ok && now.Before(s.expires) {
			break
		}
		delete(g.seen, k)
		g.order[g.head] = ""
		g.head++
	}
	if g.head > 0 && g.head*2 >= len(g.order) {
		g.order = append(g.order[:0], g.order[g.head:]...)
		g.head = 0
	}
}

func (g *ReplayGuard) remember(key string, s seenSig) {
	if _, ok := g.seen[key]; !ok {
		for len(g.seen) >= g.max && g.head < len(g.order) {
			delete(g.seen, g.order[g.head])
			g.order[g.head] = ""
			g.head++
			g.forgotten++
		}
		g.order = append(g.order, key)
	}
	g.seen[key] = s
}

// sigKey is the r value of an ASN.1 DER ECDSA signature ("" if it does not
// parse: such a signature never verified).
func sigKey(sig []byte) string {
	if len(sig) == 0 {
		return ""
	}
	var rs struct{ R, S *big.Int }
	if rest, err := asn1.Unmarshal(sig, &rs); err != nil || len(rest) > 0 || rs.R == nil {
		return ""
	}
	return string(rs.R.Bytes())
}
