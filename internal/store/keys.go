// Package store keeps Troupe's durable state in Redis: job records and their
// history, per-state indexes, job locks with fencing tokens, and DLQ entries.
//
// Every key of one job, and the state indexes that job appears in, share one
// Redis Cluster hash tag: the job's shard, {NN} with NN = fnv32a(job_id) mod
// Shards. One Lua script can therefore update the record, its history, its
// lock and the indexes atomically on a single cluster node, and a scan of "all
// RUNNING jobs" is Shards small reads rather than a cross-slot query.
//
// Redis Cluster: every script and MULTI of this package touches one hash
// slot (see Keys); nothing scans the keyspace (a SCAN would see one
// master's keys only): what must be found again is listed in a set.
package store

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// Shards is the number of hash-tag shards job keys are spread over. 64 spreads
// evenly over the 3–12 masters of a typical Redis Cluster while keeping a full
// index scan to 64 reads. Changing it re-homes every key: it is a constant.
const Shards = 64

// Keys names every Redis key Troupe uses under one prefix.
//
// The keys of a shard that every job op names (its due and lease sets, its
// state indexes, a node's lease and parked set in it) are built once and
// looked up, not concatenated per op: a job's two scripts name about ten of
// them, each an allocation otherwise.
type Keys struct {
	prefix string
	tags   [Shards]string // "{prefix}{NN}:" precomputed, no allocation per lookup
	shards [Shards]shardKeys

	// nodes holds, per node id, that node's lease and parked-set keys in
	// every shard (*nodeKeys), for at most maxCachedNodes nodes; the keys
	// of a node beyond them are built per call.
	nodes     sync.Map
	nodeCount atomic.Int32
}

type shardKeys struct {
	due, leases string
	// index is the shard's index key of each state, by stateSlot: a
	// switch on the state's string, not a map (its hash and probe were
	// ~1 % of a node's CPU at full speed, 2–3 look-ups a job; issue 33,
	// round 11).
	index [stateSlots]string
}

// stateSlots is the number of states stateSlot knows (jobstate.AllStates).
const stateSlots = 11

// stateSlot is state's slot in shardKeys.index, or -1 for a string that
// names no state.
func stateSlot(state string) int {
	switch jobstate.State(state) {
	case jobstate.StatePending:
		return 0
	case jobstate.StateApprovalRequired:
		return 1
	case jobstate.StateScheduled:
		return 2
	case jobstate.StateDispatched:
		return 3
	case jobstate.StateRunning:
		return 4
	case jobstate.StateSucceeded:
		return 5
	case jobstate.StateFailed:
		return 6
	case jobstate.StateTimeout:
		return 7
	case jobstate.StateCancelled:
		return 8
	case jobstate.StateDenied:
		return 9
	case jobstate.StateOutputQuarantined:
		return 10
	}
	return -1
}

type nodeKeys struct{ alive, parked [Shards]string }

// maxCachedNodes bounds the node keys cached: a node names its own keys on
// every op and a dead owner's while adopting its jobs; node ids that come
// and go (a pod's name per restart) must not grow the cache for ever.
const maxCachedNodes = 32

// NewKeys returns the key namer for prefix (for example "troupe:").
func NewKeys(prefix string) *Keys {
	k := &Keys{prefix: prefix}
	for i := range k.tags {
		k.tags[i] = prefix + "{" + strconv.Itoa(i) + "}:"
		sk := &k.shards[i]
		sk.due, sk.leases = k.tags[i]+"due", k.tags[i]+"leases"
		for _, st := range jobstate.AllStates {
			sk.index[stateSlot(string(st))] = k.tags[i] + "idx:" + string(st)
		}
	}
	return k
}

// node returns node's cached keys, caching them while there is room; nil
// when there is none.
func (k *Keys) node(node string) *nodeKeys {
	if v, ok := k.nodes.Load(node); ok {
		return v.(*nodeKeys)
	}
	if k.nodeCount.Load() >= maxCachedNodes {
		return nil
	}
	nk := &nodeKeys{}
	for i := range nk.alive {
		nk.alive[i] = k.tags[i] + "alive:" + node
		nk.parked[i] = k.tags[i] + "parked:" + node
	}
	if v, loaded := k.nodes.LoadOrStore(node, nk); loaded {
		return v.(*nodeKeys)
	}
	k.nodeCount.Add(1)
	return nk
}

// Prefix returns the common prefix of every key.
func (k *Keys) Prefix() string { return k.prefix }

// Shard returns the shard a job belongs to.
func Shard(jobID string) int {
	// 32-bit FNV-1a of the id's bytes, inline: no hasher, no []byte copy.
	h := uint32(2166136261)
	for i := 0; i < len(jobID); i++ {
		h ^= uint32(jobID[i])
		h *= 16777619
	}
	return int(h % Shards)
}

// Job is the hash holding a job's record.
func (k *Keys) Job(jobID string) string { return k.tags[Shard(jobID)] + "job:" + jobID }

// Lock is the job's ownership lock: value "<node>|<fence>", with a TTL.
func (k *Keys) Lock(jobID string) string { return k.tags[Shard(jobID)] + "lock:" + jobID }

// CancelMark is the hash that records a cancel of a job with no record yet
// (its submit held in the stream): the job is created CANCELLED when a node
// takes it. See lua/cancel_mark.lua.
func (k *Keys) CancelMark(jobID string) string { return k.tags[Shard(jobID)] + "cmark:" + jobID }

// jobKeys returns Job, Lock and CancelMark of jobID, in shard sh
// (Shard(jobID)), cut from one string: one allocation where each key is
// one (a job's script calls name all three).
func (k *Keys) jobKeys(sh int, jobID string) (job, lock, mark string) {
	tag := k.tags[sh]
	n := len(tag) + len(jobID)
	var b strings.Builder
	b.Grow(3*n + len("job:lock:cmark:"))
	for _, kind := range [...]string{"job:", "lock:", "cmark:"} {
		b.WriteString(tag)
		b.WriteString(kind)
		b.WriteString(jobID)
	}
	s := b.String()
	return s[:n+4], s[n+4 : 2*n+9], s[2*n+9:]
}

// Tag is the key prefix of jobID's shard ("<prefix>{NN}:"). A key of the
// shard is the tag followed by a suffix (see ShardZAdd).
func (k *Keys) Tag(jobID string) string { return k.tags[Shard(jobID)] }

// Due is the sorted set of shard's jobs that wait for a time (a retry, a
// deadline, a granted approval): member = job id, score = due time in unix
// ms. It makes every wait durable: whichever replica runs the due poller
// wakes the job if its owner did not.
func (k *Keys) Due(shard int) string { return k.shards[shard].due }

// LeaseMember is a job's lease: its member in its shard's due set (Keys.Due)
// while its owner holds its lock, score = the time by which the owner must
// renew (2 lock TTLs after its last renewal). An entry in the past means the
// owner died. "|" is in no job id (intake's ids are [A-Za-z0-9_.:-]), so a
// lease never reads as a due job. Being in the due set, a job's lease is
// written and dropped with its due entry in one ZADD or ZREM.
func LeaseMember(jobID string) string { return "|" + jobID }

// Leases is the sorted set where nodes of the version before keep leases
// (member = job id, score as LeaseMember's). This version writes none; it
// reads and adopts from it (ExpiredLeases), and drops a job's entry when it
// adopts, releases, parks or ends the job off the hot path, so a rolling
// upgrade loses no old node's lease.
func (k *Keys) Leases(shard int) string { return k.shards[shard].leases }

// Parked is the sorted set of shard's jobs that node has parked: DISPATCHED
// or RUNNING jobs with no live actor whose lock node keeps through its node
// lease (see Alive) instead of renewing it. Score = the job's due time (its
// deadline, unix ms), so the owner's own poll wakes it; when node dies the
// due poller adopts every member.
func (k *Keys) Parked(shard int, node string) string {
	if nk := k.node(node); nk != nil {
		return nk.parked[shard]
	}
	return k.tags[shard] + "parked:" + node
}

// Alive is node's lease in shard: a key with a TTL (the lock TTL) that the
// node's renewer sets again every LockTTL/3, one per shard so that the
// activation script, which checks it, stays within the job's slot. While it
// exists, the node's parked locks are held; once it has expired they are
// free to adopt.
func (k *Keys) Alive(shard int, node string) string {
	if nk := k.node(node); nk != nil {
		return nk.alive[shard]
	}
	return k.tags[shard] + "alive:" + node
}

// Nodes is the sorted set of nodes that hold a node lease: score = the time
// of the node's last lease renewal (unix ms). The due poller finds dead
// nodes here (score older than a lock TTL) and adopts their parked jobs.
func (k *Keys) Nodes() string { return k.prefix + "nodes" }

// Idempotency maps a tenant's idempotency key to the job that claimed it.
//
// The tenant is length-prefixed, not just joined with a separator: tenants
// and keys may both contain ':', and a plain join made tenant "org" with key
// "team:k1" the same Redis key as tenant "org:team" with key "k1", so one
// tenant's submit was taken for another's duplicate. The "idem2:" namespace
// is apart from the joined form's "idem:", so a record written in that form
// is never read as a claim; it expires with its TTL.
func (k *Keys) Idempotency(tenant, key string) string {
	return k.prefix + "idem2:" + strconv.Itoa(len(tenant)) + ":" + tenant + ":" + key
}

// TenantActive is the sorted set of a tenant's jobs that hold one of its
// concurrency slots (member = job id, score = admission time, unix ms).
// One key per tenant, shared by every replica: the limit is cluster-wide.
func (k *Keys) TenantActive(tenant string) string { return k.prefix + "tenant:" + tenant + ":active" }

// Epoch is a key set once and never expired: its disappearance tells the
// nodes that Redis lost its data (see LockRenewer.OnDataLoss).
func (k *Keys) Epoch() string { return k.prefix + "epoch" }

// Tenants is the set of every TenantActive key ever used, so the slot
// repair reads a list instead of scanning the keyspace.
func (k *Keys) Tenants() string { return k.prefix + "tenants" }

// Index is the sorted set of shard's jobs in state.
func (k *Keys) Index(shard int, state string) string {
	if i := stateSlot(state); i >= 0 {
		return k.shards[shard].index[i]
	}
	return k.tags[shard] + "idx:" + state
}

// DLQ is the stream of dead-lettered inputs and jobs.
func (k *Keys) DLQ() string { return k.prefix + "dlq" }

// DLQOutbox is the sorted set of shard's DLQ entries whose write applied
// but which may not be in the DLQ stream yet (member = the encoded entry,
// score = when it was written, unix ms). A job script adds the entry in the
// same atomic step as the state change it dead-letters, so the entry exists
// exactly when the change applied; the writer then appends it to the DLQ
// stream, which lives in another slot (see dlqAppendScript), and the due
// poller flushes whatever a crash left behind (Store.FlushDLQOutbox).
func (k *Keys) DLQOutbox(shard int) string { return k.tags[shard] + dlqOutboxSuffix }

const dlqOutboxSuffix = "dlqout"

// DLQMark records that the outbox entry id reached the DLQ stream, so a
// repeated append (a retried op, a flush after a crash) adds nothing. It
// shares the stream's hash slot, so one script checks it and appends: the
// stream's name carries no hash tag, so its slot is that of its whole name,
// which is what the tag {<name>} selects.
func (k *Keys) DLQMark(id string) string {
	if hasHashTag(k.DLQ()) {
		return k.DLQ() + ":op:" + id // the same (first) tag
	}
	return k.prefix + "{" + k.DLQ() + "}:op:" + id
}

// hasHashTag reports whether Redis Cluster hashes key by a tag: a "{"
// followed, later, by a "}" with at least one character between.
func hasHashTag(key string) bool {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return false
	}
	j := strings.IndexByte(key[i+1:], '}')
	return j > 0
}
