package store

import "github.com/redis/go-redis/v9"

// Every write that changes a job's state is one of these scripts, so a
// transition is a single atomic compare-and-set. All keys a script touches
// share the job's hash tag (see Keys), which keeps each script on one Redis
// Cluster node. The shard's index and due-set names are built inside the
// script from the shard's tag; they carry the same tag, so they live in the
// same slot.
//
// History entries are "unix_ms|from|to|reason|node".

// activateScript takes a job's lock and reports its state. When the job does
// not exist and the caller asks for it, the script creates it and applies the
// caller's plan — the first decision about the job (for example PENDING →
// SCHEDULED → DISPATCHED to a chosen worker) — in the same call, so the happy
// path costs one script to create and dispatch and one to finish.
//
// KEYS: job, hist, lock
// ARGV: node, now_ms, lock_ttl_ms, create(0|1), shard_tag, job_id, topic,
//
//	tenant, trace_id, request(bytes), rescue_at_ms, lock_after
//	(keep|release|terminal), due_ms (0 = rescue_at, -1 none, >0 set),
//	retention_s, n, then n pairs (to, reason), then the shard writes
//	(see shardWritesLua), then field, value, ...
//
// A created job with no due time of its own is due at rescue_at: every live
// job has a due entry from its first moment, so a job whose actor or node
// dies before it records a wait of its own is still woken by the due poller.
//
// A lock is "<node>|<fence>" with a TTL (renewed by its node), or
// "<node>|<fence>|p" with none: a parked job's lock, held through the node's
// lease (the key "<tag>alive:<node>", see Keys.Alive). A parked lock of a
// node whose lease has expired is free: activating it adopts the job. Any
// activation of a parked job takes it out of its node's parked set and puts
// its deadline back in the due set.
//
// Returns {status, state, fence, holder, field, value, ...} with status one of
// CREATED (state = where the plan left it), ADOPTED (holder = the lock value
// before, so the caller sees whether the job was parked; the record's fields
// follow), BUSY (another node holds the lock), TERMINAL (no lock taken),
// NOTFOUND. A job that is terminal or missing loses its due entry: nothing
// will ever wait for it.
var activateScript = luaScript("activate", "shard_writes")

// transitionScript moves a job along a path of states in one atomic step,
// only if it is in one of the expected states and only while the caller's
// lock value ("<node>|<fence>") is the current one.
//
// KEYS: job, hist, lock
// ARGV: lock_value, node, expected (comma-separated states), now_ms,
//
//	shard_tag, job_id, lock_after (keep|release|terminal), retention_s,
//	due_ms (0 keep, -1 clear, >0 set), n, then n pairs (to, reason), then
//	the shard writes made in the same step (saga records and triggers; see
//	shardWritesLua), then field, value, ...
//
// Returns {status, state_before} with status OK, FENCED (lock value differs:
// this owner is stale; then state_before is the lock's value, and the
// record's "op" field and state follow), NOTFOUND or CONFLICT (state not
// expected; then a third element: the record's "op" field, the identity of
// the write that put it there — see Transition.Op). The "op" field tells a
// retried write whether its first try applied: a write that released the
// lock (a terminal one) is FENCED when tried again.
var transitionScript = luaScript("transition", "shard_writes")

// releaseScript (lua/release.lua) gives a job's lock up, and its lease,
// if the caller still holds the lock.
var releaseScript = luaScript("release")

type releaseCall struct {
	lockKey, leasesKey string
	lockValue, jobID   string
}

func (releaseCall) script() *redis.Script { return releaseScript }
func (c releaseCall) keys() []string      { return []string{c.lockKey, c.leasesKey} }
func (c releaseCall) args() []interface{} { return []interface{}{c.lockValue, c.jobID} }

// renewScript (lua/renew.lua) extends one lock, and moves its lease, if the
// caller still holds the lock. It is loaded but nothing calls it: the
// renewer uses renewManyScript.
//
// The lease (a per-shard sorted set, score = when the owner must have
// renewed by) is what makes a dead owner visible: when a node dies its
// leases stop moving, and the due poller wakes every job whose lease ran
// out, so another replica adopts it without waiting for a result or a
// deadline.
var renewScript = luaScript("renew")

// parkScript (lua/park.lua) parks a DISPATCHED or RUNNING job whose actor
// stops: its lock is then held through the node's lease (Keys.Alive), and
// the job waits in the node's parked set.
var parkScript = luaScript("park")

type parkCall struct {
	lockKey, leasesKey, parkedKey, aliveKey, dueKey string
	lockValue, jobID                                string
	dueMs, leaseTTLMs                               int64
}

func (parkCall) script() *redis.Script { return parkScript }
func (c parkCall) keys() []string {
	return []string{c.lockKey, c.leasesKey, c.parkedKey, c.aliveKey, c.dueKey}
}
func (c parkCall) args() []interface{} {
	return []interface{}{c.lockValue, c.jobID, c.dueMs, c.leaseTTLMs}
}

// deadNodeScript (lua/dead_node.lua) marks a dead node in the nodes set as
// being adopted, or forgets it, if it has not renewed its lease since the
// caller saw it dead.
var deadNodeScript = luaScript("dead_node")

type deadNodeCall struct {
	nodesKey string
	node     string
	beforeMs int64
	// mark is the node's new score, or "forget".
	mark string
}

func (deadNodeCall) script() *redis.Script { return deadNodeScript }
func (c deadNodeCall) keys() []string      { return []string{c.nodesKey} }
func (c deadNodeCall) args() []interface{} { return []interface{}{c.node, c.beforeMs, c.mark} }

// claimScript (lua/claim.lua) claims an idempotency key for a job, or names
// the job that holds it already.
var claimScript = luaScript("claim")

type claimCall struct {
	idemKey string
	jobID   string
	ttlS    int64
}

func (claimCall) script() *redis.Script { return claimScript }
func (c claimCall) keys() []string      { return []string{c.idemKey} }
func (c claimCall) args() []interface{} { return []interface{}{c.jobID, c.ttlS} }

// dueScript (lua/due.lua) pops the members of a due or parked set that are
// due, and pushes them later; dueScoresScript (lua/due_scores.lua) does the
// same and returns each member's score before the move.
var (
	dueScript       = luaScript("due")
	dueScoresScript = luaScript("due_scores")
)

type dueCall struct {
	withScores bool // dueScoresScript rather than dueScript
	setKey     string
	cutoffMs   int64
	limit      int
	laterMs    int64
}

func (c dueCall) script() *redis.Script {
	if c.withScores {
		return dueScoresScript
	}
	return dueScript
}
func (c dueCall) keys() []string      { return []string{c.setKey} }
func (c dueCall) args() []interface{} { return []interface{}{c.cutoffMs, c.limit, c.laterMs} }

// trimScript (lua/trim.lua) drops old entries from a shard's terminal-state
// indexes.
var trimScript = luaScript("trim")

type trimCall struct {
	indexKeys []string
	beforeMs  int64
}

func (trimCall) script() *redis.Script { return trimScript }
func (c trimCall) keys() []string      { return c.indexKeys }
func (c trimCall) args() []interface{} { return []interface{}{c.beforeMs} }

// admitScript (lua/admit.lua) takes one of a tenant's concurrency slots for
// a job.
var admitScript = luaScript("admit")

type admitCall struct {
	activeKey string
	jobID     string
	limit     int
	nowMs     int64
}

func (admitCall) script() *redis.Script { return admitScript }
func (c admitCall) keys() []string      { return []string{c.activeKey} }
func (c admitCall) args() []interface{} { return []interface{}{c.jobID, c.limit, c.nowMs} }

// renewManyScript (lua/renew_many.lua) renews many live locks of one shard,
// and their leases, in one call.
var renewManyScript = luaScript("renew_many")

// renewManyCall renews locks, all of one shard.
type renewManyCall struct {
	leasesKey    string
	ttlMs        int64
	leaseUntilMs int64
	locks        []renewedLock
}

// renewedLock is one lock of a renewManyCall.
type renewedLock struct {
	jobID, lockKey, lockValue string
}

func (renewManyCall) script() *redis.Script { return renewManyScript }
func (c renewManyCall) keys() []string {
	keys := make([]string, 0, 1+len(c.locks))
	keys = append(keys, c.leasesKey)
	for _, l := range c.locks {
		keys = append(keys, l.lockKey)
	}
	return keys
}
func (c renewManyCall) args() []interface{} {
	args := make([]interface{}, 0, 2+2*len(c.locks))
	args = append(args, c.ttlMs, c.leaseUntilMs)
	for _, l := range c.locks {
		args = append(args, l.jobID, l.lockValue)
	}
	return args
}

// approveScript (lua/approve.lua) records a human decision on a job that
// waits for one, and makes the job due now.
var approveScript = luaScript("approve")

type approveCall struct {
	jobKey, dueKey             string
	decision, by, reason, hash string
	nowMs                      int64
	jobID                      string
}

func (approveCall) script() *redis.Script { return approveScript }
func (c approveCall) keys() []string      { return []string{c.jobKey, c.dueKey} }
func (c approveCall) args() []interface{} {
	return []interface{}{c.decision, c.by, c.reason, c.hash, c.nowMs, c.jobID}
}

// downgradeScript (lua/downgrade.lua) moves a SUCCEEDED job to
// OUTPUT_QUARANTINED if it is still SUCCEEDED.
var downgradeScript = luaScript("downgrade")

type downgradeCall struct {
	jobKey, histKey, fromIndexKey, toIndexKey string
	nowMs                                     int64
	reason, node, jobID                       string
	fields                                    []string // field, value, ...
}

func (downgradeCall) script() *redis.Script { return downgradeScript }
func (c downgradeCall) keys() []string {
	return []string{c.jobKey, c.histKey, c.fromIndexKey, c.toIndexKey}
}
func (c downgradeCall) args() []interface{} {
	args := make([]interface{}, 0, 4+len(c.fields))
	args = append(args, c.nowMs, c.reason, c.node, c.jobID)
	for _, f := range c.fields {
		args = append(args, f)
	}
	return args
}

var allScripts = []*redis.Script{downgradeScript, admitScript, activateScript, transitionScript, releaseScript, renewScript,
	approveScript, claimScript, dueScript, dueScoresScript, trimScript, parkScript, renewManyScript, deadNodeScript}
