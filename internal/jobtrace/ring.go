package jobtrace

import (
	"reflect"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/ctxext"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// ringExtensionID finds an actor's ring among its context extensions.
var ringExtensionID = ctxext.NextContextExtensionID()

// record is one entry as the hot path keeps it: no strings are built per
// message. The sender PID and the message type are kept as pointers and
// turned into text only when someone reads the ring or it is persisted;
// state and reason strings come from the actor and are not copied.
type record struct {
	at     int64 // unix ns
	took   int64 // ns
	sender *actor.PID
	origin string
	typ    reflect.Type
	before string
	after  string
	reason string
	// panicked: the actor panicked handling the message.
	panicked bool
}

// ring is one actor's bounded trace. The actor's goroutine appends; readers
// (the admin API) copy under the same mutex, which the actor takes once per
// message, uncontended unless someone is reading that very job.
type ring struct {
	// Immutable after newRing.
	jobID      string
	node       string
	activation int64
	size       int

	mu    sync.Mutex
	recs  []record // grows up to size, then wraps at next
	next  int
	total uint64
}

func newRing(jobID, node string, size int) *ring {
	// Start small: most jobs never fill the ring.
	return &ring{jobID: jobID, node: node, activation: time.Now().UnixNano(), size: size,
		recs: make([]record, 0, min(size, 16))}
}

// ExtensionID implements ctxext.ContextExtension.
func (r *ring) ExtensionID() ctxext.ContextExtensionID { return ringExtensionID }

func (r *ring) add(rec record) {
	r.mu.Lock()
	if len(r.recs) < r.size {
		r.recs = append(r.recs, rec)
	} else {
		r.recs[r.next] = rec
		r.next = (r.next + 1) % r.size
	}
	r.total++
	r.mu.Unlock()
}

// entries returns the ring oldest first.
func (r *ring) entries(live bool) []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.recs)
	out := make([]Entry, 0, n)
	first := r.total - uint64(n) // sequence number of the oldest kept entry
	for i := 0; i < n; i++ {
		rec := r.recs[(r.next+i)%n]
		e := Entry{At: time.Unix(0, rec.at), Node: r.node, Activation: r.activation, Seq: first + uint64(i),
			Sender: rec.origin, Before: rec.before, After: rec.after, Reason: rec.reason,
			HandleNanos: rec.took, Panicked: rec.panicked, Live: live}
		if rec.sender != nil {
			e.Sender = rec.sender.GetId()
		}
		if rec.typ != nil {
			e.Type = rec.typ.String()
		}
		if i == 0 {
			e.Dropped = first
		}
		out = append(out, e)
	}
	return out
}

// terminal reports whether the job's last recorded state is terminal.
func (r *ring) terminal() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.recs)
	if n == 0 {
		return false
	}
	last := r.recs[(r.next+n-1)%n]
	return jobstate.State(last.after).Terminal()
}
