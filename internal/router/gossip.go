package router

import (
	"encoding/binary"
	"errors"
	"sort"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/registry"
)

// Sharing in-flight counts between replicas.
//
// Replicas share workers, and each counts only its own jobs exactly. So
// that the pool is not filled once per replica, every router publishes how
// many jobs it has in flight on each worker — a few milliseconds after a
// count changes (changes in that window go out together), and all of them
// once a second while any is non-zero — and adds up what the others
// publish (registry.SetOthers). A replica that falls silent for PeerTTL is
// forgotten; the jobs it left at workers are then counted by the workers'
// heartbeats (registry Foreign) until their adopters count them again.
//
// The error this leaves is bounded by what a replica can place during one
// report's trip (GossipDelay plus a NATS hop, well under 10 ms): two
// replicas that both see the same free slot in that window may both use
// it. A freed slot goes first to the replica whose job freed it (its router
// drains its own queue at once), so under steady load a slot is seldom
// seen free by the others at all. BENCHMARKS.md measures the overfill as
// workers count it.

const (
	// GossipDelay is how long a changed count waits to go out with others.
	GossipDelay = 2 * time.Millisecond
	// PeerTTL forgets a replica that has published nothing for this long
	// (it publishes at least once a second while it has jobs in flight).
	PeerTTL = 3 * time.Second
	// gossipVersion leads every report.
	gossipVersion = 2
	// maxGossipEntries bounds one report, and what a report may make a
	// receiver allocate.
	maxGossipEntries = 1 << 16
)

// PeerLoad is another replica's report of its in-flight counts.
type PeerLoad struct {
	Node string
	// Full: Counts is everything the replica has in flight; workers it
	// does not name have none of its jobs. Otherwise only changed counts.
	Full bool
	// Hello: the replica has just begun to listen for reports; every
	// replica answers with a full one. (Its reports from before may have
	// been heard, and their answers missed.)
	Hello  bool
	Counts map[string]int32
	// Waiting is how many jobs wait in the replica's queue, per pool (all
	// of them: a pool it does not name has none).
	Waiting map[string]int32
	// Offers and Acks are addressed to one replica each (see stewards.go).
	Offers []Offer
	Acks   []OfferAck
	At     time.Time
}

// peer is what one other replica last reported.
type peer struct {
	counts  map[string]int32
	waiting map[string]int32
	seen    time.Time
	// offered: slots this node has offered it per pool, not yet answered;
	// declined: pools whose offers it could not use, until when.
	offered  map[string]int32
	declined map[string]time.Time
}

type gossipTick struct{}

// changed notes that this node's count on w changed, to be published.
func (r *Router) changed(c actor.Context, w *registry.Worker) {
	if r.cfg.Gossip == nil {
		return
	}
	r.dirty[w] = struct{}{}
	r.kick(c)
}

// kick makes the next report go out within GossipDelay.
func (r *Router) kick(c actor.Context) {
	if r.cfg.Gossip == nil || r.armed {
		return
	}
	r.armed = true
	self, root := c.Self(), c.ActorSystem().Root
	time.AfterFunc(GossipDelay, func() { root.Send(self, gossipTick{}) })
}

// publish sends a report: the changed counts (with full, every non-zero
// one), the queue lengths, and the offers and acks waiting to go. A full
// report goes out every sweep, empty or not, when the router starts, and
// in answer to a replica heard for the first time or saying Hello, so
// replicas know each other at once.
func (r *Router) publish(full bool) {
	if r.cfg.Gossip == nil {
		return
	}
	full = full || r.full
	if !full && len(r.peers) == 0 {
		clear(r.dirty) // nobody to tell; the next full report says it all
		return
	}
	m := &PeerLoad{Node: r.cfg.NodeID, Full: full, Hello: r.hello, Counts: map[string]int32{},
		Waiting: r.waitingPerPool(), Offers: r.outOffers, Acks: r.outAcks}
	if full {
		for _, p := range r.reg.Pools() {
			for _, w := range r.reg.Pool(p) {
				if n := own(w); n > 0 {
					m.Counts[w.ID] = n
				}
			}
		}
	} else {
		for w := range r.dirty {
			m.Counts[w.ID] = own(w)
		}
	}
	clear(r.dirty)
	r.outOffers, r.outAcks, r.full, r.hello = nil, nil, false, false
	r.cfg.Gossip(EncodePeerLoad(m))
}

// peersChanged tells OnPeers how many replicas the router knows now.
func (r *Router) peersChanged() {
	if r.cfg.Gossip != nil && r.cfg.OnPeers != nil {
		r.cfg.OnPeers(len(r.peers))
	}
}

// own is this node's effective count on w (InFlight less the others').
func own(w *registry.Worker) int32 { return max(w.InFlight()-w.Others-w.Foreign, 0) }

// peerLoad applies another replica's report.
func (r *Router) peerLoad(c actor.Context, m *PeerLoad) {
	if m.Node == "" || m.Node == r.cfg.NodeID {
		return
	}
	p := r.peers[m.Node]
	if p == nil {
		p = &peer{counts: map[string]int32{}, waiting: map[string]int32{}, offered: map[string]int32{},
			declined: map[string]time.Time{}}
		r.peers[m.Node] = p
		r.reassignShares(c)
		r.peersChanged()
		r.full = true // the newcomer learns this node's counts at once
		r.kick(c)
	} else if m.Hello {
		r.full = true // it may have missed the answer to its first report
		r.kick(c)
	}
	p.seen = m.At
	if p.seen.IsZero() {
		p.seen = r.now()
	}
	if m.Full {
		for id := range p.counts {
			if _, ok := m.Counts[id]; !ok {
				r.peerCount(c, p, id, 0)
			}
		}
	}
	for id, n := range m.Counts {
		r.peerCount(c, p, id, n)
	}
	r.peerOffers(c, m.Node, p, m)
}

// peerCount sets one replica's count on one worker.
func (r *Router) peerCount(c actor.Context, p *peer, id string, n int32) {
	old := p.counts[id]
	if n <= 0 {
		delete(p.counts, id)
		n = 0
	} else {
		p.counts[id] = n
	}
	if n == old {
		return
	}
	w := r.reg.Get(id)
	if w == nil {
		return // counted when the worker joins
	}
	r.reg.SetOthers(w, w.Others+n-old)
	if n < old && r.reg.HasRoom(w) {
		r.drain(c, w.Pool)
	}
}

// expirePeers forgets replicas silent for PeerTTL.
func (r *Router) expirePeers(c actor.Context) {
	now := r.now()
	for id, p := range r.peers {
		if now.Sub(p.seen) < PeerTTL {
			continue
		}
		for w := range p.counts {
			r.peerCount(c, p, w, 0)
		}
		delete(r.peers, id)
		r.reassignShares(c)
		r.peersChanged()
	}
}

// EncodePeerLoad encodes a report: version, flags, node id, then four
// sections — counts (worker id, count), waiting (pool, jobs), offers (to,
// id, worker, slots) and acks (to, id, worker, used, count) — each a
// uvarint length and its entries; strings are length-prefixed, numbers
// uvarints, counts in worker id order.
func EncodePeerLoad(m *PeerLoad) []byte {
	ids := make([]string, 0, len(m.Counts))
	size := 16 + len(m.Node) + 24*(len(m.Offers)+len(m.Acks))
	for id := range m.Counts {
		ids = append(ids, id)
		size += len(id) + 8
	}
	sort.Strings(ids)
	pools := make([]string, 0, len(m.Waiting))
	for p := range m.Waiting {
		pools = append(pools, p)
		size += len(p) + 8
	}
	sort.Strings(pools)
	b := make([]byte, 0, size)
	flags := byte(0)
	if m.Full {
		flags = 1
	}
	if m.Hello {
		flags |= 2
	}
	b = append(b, gossipVersion, flags)
	b = appendString(b, m.Node)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = appendString(b, id)
		b = binary.AppendUvarint(b, uint64(max(m.Counts[id], 0)))
	}
	b = binary.AppendUvarint(b, uint64(len(pools)))
	for _, p := range pools {
		b = appendString(b, p)
		b = binary.AppendUvarint(b, uint64(max(m.Waiting[p], 0)))
	}
	b = binary.AppendUvarint(b, uint64(len(m.Offers)))
	for _, o := range m.Offers {
		b = appendString(b, o.To)
		b = binary.AppendUvarint(b, o.ID)
		b = appendString(b, o.Worker)
		b = binary.AppendUvarint(b, uint64(max(o.N, 0)))
	}
	b = binary.AppendUvarint(b, uint64(len(m.Acks)))
	for _, a := range m.Acks {
		b = appendString(b, a.To)
		b = binary.AppendUvarint(b, a.ID)
		b = appendString(b, a.Worker)
		b = binary.AppendUvarint(b, uint64(max(a.Used, 0)))
		b = binary.AppendUvarint(b, uint64(max(a.Count, 0)))
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

var errBadPeerLoad = errors.New("router: malformed capacity report")

// decoder reads EncodePeerLoad's fields; the first failure sticks.
type decoder struct {
	b  []byte
	ok bool
}

func (d *decoder) num(limit uint64) uint64 {
	if !d.ok {
		return 0
	}
	n, k := binary.Uvarint(d.b)
	if k <= 0 || n > limit {
		d.ok = false
		return 0
	}
	d.b = d.b[k:]
	return n
}

func (d *decoder) str() string {
	n := d.num(uint64(len(d.b)))
	if !d.ok || n > uint64(len(d.b)) {
		d.ok = false
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// entries reads a section's length: at most maxGossipEntries, and no more
// than the bytes left could hold (each entry takes two or more).
func (d *decoder) entries() int {
	return int(d.num(min(maxGossipEntries, uint64(len(d.b)))))
}

// DecodePeerLoad decodes EncodePeerLoad's output; anything else is an
// error, never a panic.
func DecodePeerLoad(b []byte) (*PeerLoad, error) {
	if len(b) < 2 || b[0] != gossipVersion || b[1]&^3 != 0 {
		return nil, errBadPeerLoad
	}
	d := &decoder{b: b[2:], ok: true}
	m := &PeerLoad{Full: b[1]&1 != 0, Hello: b[1]&2 != 0}
	if m.Node = d.str(); m.Node == "" {
		return nil, errBadPeerLoad
	}
	const maxCount = 1 << 30
	n := d.entries()
	m.Counts = make(map[string]int32, n)
	for range n {
		id := d.str()
		m.Counts[id] = int32(d.num(maxCount))
	}
	n = d.entries()
	m.Waiting = make(map[string]int32, n)
	for range n {
		p := d.str()
		m.Waiting[p] = int32(d.num(maxCount))
	}
	n = d.entries()
	for range n {
		o := Offer{To: d.str(), ID: d.num(1<<63 - 1)}
		o.Worker = d.str()
		o.N = int32(d.num(maxCount))
		m.Offers = append(m.Offers, o)
	}
	n = d.entries()
	for range n {
		a := OfferAck{To: d.str(), ID: d.num(1<<63 - 1)}
		a.Worker = d.str()
		a.Used = int32(d.num(maxCount))
		a.Count = int32(d.num(maxCount))
		m.Acks = append(m.Acks, a)
	}
	if !d.ok || len(d.b) != 0 {
		return nil, errBadPeerLoad
	}
	return m, nil
}
