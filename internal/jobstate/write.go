package jobstate

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/proto/capv1"
)

// The data of a state change, as the decision core (internal/lifecycle)
// builds it and the store (internal/store) writes it. Both import it from
// here, so the core depends on nothing of the store's.

// Hop is one state change within a Transition.
type Hop struct {
	To     State
	Reason Reason
}

// Transition is a path of state changes written in one script call: the job
// must be in one of the Expect states, then passes through every hop (each
// recorded in its history) and ends in the last one.
type Transition struct {
	// Expect lists the states the job may be in (comma-separated, see
	// Expect). Ignored when the transition is the plan of a created job,
	// which starts in PENDING.
	Expect string
	Path   []Hop
	// Fields are record fields to set, as name, value pairs.
	Fields []string
	// Due sets the job's due time (unix ms); -1 clears it; 0 leaves it (on a
	// created job: the rescue time). A terminal end clears it.
	Due int64
	// Release gives the lock up (the job passivates: it waits for an outside
	// event with no live actor). A terminal end always releases the lock and
	// starts the retention clock.
	Release bool
	// Adds are sorted-set entries, and Sets hash fields, written in the
	// same atomic step, in keys of the job's shard (so a Redis Cluster runs
	// it on one node). Adds are written before Sets, each in order.
	Adds []ShardZAdd
	Sets []ShardHSet
	// Op, when set, identifies this write: it is stored as the record's
	// "op" field. A write whose reply was lost (a Redis timeout) may still
	// have landed; when the caller retries it and finds the job already
	// where the write would have put it, the op tells it whether that was
	// its own write — and so whether its side effect is still owed.
	Op string
}

// ShardZAdd is one ZADD into a key of the job's shard: the key is the
// shard's tag followed by Suffix (for example "saga:stack:<workflow_id>").
type ShardZAdd struct {
	Suffix string
	Score  int64
	Member string
	// TrimBelow, when positive, first removes the key's entries scored
	// below it, so entries scored by time live a bounded while.
	TrimBelow int64
	// TTL, when positive, sets the key to expire TTL after this write (a
	// key each write refreshes lives TTL past its last write). Zero leaves
	// the key's expiry as it is.
	TTL time.Duration
}

// ShardHSet is one HSET of Field into a key of the job's shard (the
// shard's tag followed by Suffix), with TTL as in ShardZAdd.
type ShardHSet struct {
	Suffix string
	Field  string
	Value  string
	TTL    time.Duration
}

// Final is the state the transition ends in.
func (t *Transition) Final() State { return t.Path[len(t.Path)-1].To }

// LockAfter says what becomes of the owner's lock after t: "keep",
// "release" (t.Release) or "terminal" (t ends in a terminal state). A nil
// transition keeps it.
func (t *Transition) LockAfter() string {
	switch {
	case t == nil:
		return "keep"
	case t.Final().Terminal():
		return "terminal"
	case t.Release:
		return "release"
	}
	return "keep"
}

// LockKept reports whether the owner still holds the lock after t.
func (t *Transition) LockKept() bool { return t.LockAfter() == "keep" }

// Expect joins states for Transition.Expect.
func Expect(states ...State) string {
	switch len(states) {
	case 1:
		return string(states[0]) // no copy: most transitions expect one state
	case 2:
		return string(states[0]) + "," + string(states[1])
	}
	var b strings.Builder
	for i, st := range states {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(string(st))
	}
	return b.String()
}

// DLQEntry is one dead-lettered input or job.
type DLQEntry struct {
	// ID is the entry's stream id (set when read back).
	ID      string
	JobID   string
	Topic   string
	Reason  Reason
	Message string
	// LastReason keeps the underlying cause when Reason summarises it
	// (for example max_scheduling_retries after no_workers).
	LastReason Reason
	Subject    string
	TraceID    string
	// Raw is the packet as received, when it could not be decoded or used;
	// the store keeps (and reads back) its first bytes only.
	Raw []byte
	// RawSize and RawSHA256 are the size and the hex SHA-256 of the whole
	// packet (set when read back; computed from Raw when written).
	RawSize   int64
	RawSHA256 string
	At        time.Time
}

// LockValue is the value of a job lock held by node under fence.
func LockValue(node string, fence int64) string {
	return node + "|" + strconv.FormatInt(fence, 10)
}

// Record fields a job's create writes about the time before it, in unix
// ms: when its submit was stored, and when its wait for room began (see
// store.History).
const (
	FieldSubmitted = "sub"
	FieldWaited    = "wq"
)

// Decision is a human's answer to an approval request.
type Decision string

const (
	DecisionApproved Decision = "approved"
	DecisionRejected Decision = "rejected"
)

// TenantOf returns the request's tenant: its tenant_id, else its env's
// tenant_id, else "default".
func TenantOf(req *capv1.JobRequest) string {
	if req.TenantId != "" {
		return req.TenantId
	}
	if t := req.Env["tenant_id"]; t != "" {
		return t
	}
	return "default"
}

// HashRequest is the hex SHA-256 of the request's deterministic encoding,
// less the labels and env entries that change on the way (approval_*
// labels, the bus message id, the effective config): an approval is for
// exactly the job that asked for it.
func HashRequest(req *capv1.JobRequest) string {
	c := proto.Clone(req).(*capv1.JobRequest)
	for k := range c.Labels {
		if strings.HasPrefix(k, "approval_") || k == "cordum.bus_msg_id" {
			delete(c.Labels, k)
		}
	}
	delete(c.Env, "CORDUM_EFFECTIVE_CONFIG")
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// EncodeRequest is the request as a job's record stores it (its "req"
// field): its protobuf encoding.
func EncodeRequest(req *capv1.JobRequest) ([]byte, error) { return proto.Marshal(req) }

// DecodeRequest reads a request EncodeRequest wrote.
func DecodeRequest(raw []byte) (*capv1.JobRequest, error) {
	req := &capv1.JobRequest{}
	if err := proto.Unmarshal(raw, req); err != nil {
		return nil, err
	}
	return req, nil
}

// FieldLanded is the record field a write's script sets to when the write
// landed, on Redis's clock (unix ms), where the write's fields give it the
// value LandedNow: a dispatch on a tenant or key slot (lifecycle,
// adoptedSlotStale), whose slot may have been given away had it landed
// long after the job asked for it.
const (
	FieldLanded = "dat"
	LandedNow   = "\x00now"
)
