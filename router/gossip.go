package router

import (
	"encoding/binary"
	"errors"
	"sort"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/registry"
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
	gossipVersion = 1
	// maxGossipEntries bounds one report, and what a report may make a
	// receiver allocate.
	maxGossipEntries = 1 << 16
)

// PeerLoad is another replica's report of its in-flight counts.
type PeerLoad struct {
	Node string
	// Full: Counts is everything the replica has in flight; workers it
	// does not name have none of its jobs. Otherwise only changed counts.
	Full   bool
	Counts map[string]int32
	At     time.Time
}

// peer is what one other replica last reported.
type peer struct {
	counts map[string]int32
	seen   time.Time
}

type gossipTick struct{}

// changed notes that this node's count on w changed, to be published.
func (r *Router) changed(c actor.Context, w *registry.Worker) {
	if r.cfg.Gossip == nil {
		return
	}
	r.dirty[w] = struct{}{}
	if r.armed {
		return
	}
	r.armed = true
	self, root := c.Self(), c.ActorSystem().Root
	time.AfterFunc(GossipDelay, func() { root.Send(self, gossipTick{}) })
}

// publish sends the changed counts, or with full every non-zero count.
// The full report goes out every sweep, empty or not, when the router
// starts, and in answer to a replica heard for the first time, so replicas
// know each other at once.
func (r *Router) publish(full bool) {
	if r.cfg.Gossip == nil {
		return
	}
	counts := map[string]int32{}
	if full {
		for _, p := range r.reg.Pools() {
			for _, w := range r.reg.Pool(p) {
				if n := own(w); n > 0 {
					counts[w.ID] = n
				}
			}
		}
	} else {
		for w := range r.dirty {
			counts[w.ID] = own(w)
		}
		if len(counts) == 0 {
			return
		}
	}
	clear(r.dirty)
	r.cfg.Gossip(EncodePeerLoad(r.cfg.NodeID, full, counts))
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
		p = &peer{counts: map[string]int32{}}
		r.peers[m.Node] = p
		r.publish(true) // the newcomer learns this node's counts now
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
	}
}

// EncodePeerLoad encodes a report: version, flags, node id, then
// (worker id, count) pairs, ids length-prefixed, numbers as uvarints, in
// worker id order.
func EncodePeerLoad(node string, full bool, counts map[string]int32) []byte {
	ids := make([]string, 0, len(counts))
	size := 4 + len(node)
	for id := range counts {
		ids = append(ids, id)
		size += len(id) + 8
	}
	sort.Strings(ids)
	b := make([]byte, 0, size)
	flags := byte(0)
	if full {
		flags = 1
	}
	b = append(b, gossipVersion, flags)
	b = binary.AppendUvarint(b, uint64(len(node)))
	b = append(b, node...)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
		b = binary.AppendUvarint(b, uint64(max(counts[id], 0)))
	}
	return b
}

var errBadPeerLoad = errors.New("router: malformed capacity report")

// DecodePeerLoad decodes EncodePeerLoad's output; anything else is an
// error, never a panic.
func DecodePeerLoad(b []byte) (*PeerLoad, error) {
	if len(b) < 2 || b[0] != gossipVersion {
		return nil, errBadPeerLoad
	}
	m := &PeerLoad{Full: b[1]&1 != 0}
	b = b[2:]
	str := func() (string, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return "", false
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s, true
	}
	num := func() (uint64, bool) {
		n, k := binary.Uvarint(b)
		if k <= 0 {
			return 0, false
		}
		b = b[k:]
		return n, true
	}
	var ok bool
	if m.Node, ok = str(); !ok || m.Node == "" {
		return nil, errBadPeerLoad
	}
	n, ok := num()
	if !ok || n > maxGossipEntries || n > uint64(len(b)) {
		return nil, errBadPeerLoad
	}
	m.Counts = make(map[string]int32, n)
	for range n {
		id, ok := str()
		if !ok {
			return nil, errBadPeerLoad
		}
		c, ok := num()
		if !ok || c > 1<<30 {
			return nil, errBadPeerLoad
		}
		m.Counts[id] = int32(c)
	}
	if len(b) != 0 {
		return nil, errBadPeerLoad
	}
	return m, nil
}
