package store

import (
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// Every write that changes a job's state is one of these scripts, so a
// transition is a single atomic compare-and-set. Each script's file under
// lua/ says what it does, its KEYS and its ARGV. Every key a script touches
// is in its KEYS, and all the keys of one call share one Redis Cluster hash
// slot: a job's keys and its shard's sets carry the shard's hash tag (see
// Keys), and the global keys (the nodes set, an idempotency key, a tenant's
// active set, a lease) are each a script's only key. The DLQ scripts' two
// keys share the stream's slot (Keys.DLQMark).

// activateScript (lua/activate.lua) takes a job's lock and reports its
// state; it creates a missing job when asked, and applies the caller's plan
// to it in the same call.
var activateScript = luaScript("activate", "shard_writes", "hops")

// activateMultiScript is activateScript for several jobs in one call
// (multiScript, lua/lib/multi.lua).
var activateMultiScript = multiScript("activate", "shard_writes", "hops")

// activateCall is a call of activateScript.
type activateCall struct {
	jobKey, lockKey, dueKey, leasesKey string
	// indexKey is the shard's index of the state the plan ends in.
	indexKey string
	// ownerAliveKey and ownerParkedKey are parkedOwner's lease and parked
	// set in the job's shard.
	ownerAliveKey, ownerParkedKey string
	// markKey is the job's cancel mark; cancelledKey the shard's index of
	// CANCELLED, where a job created cancelled by its mark goes.
	markKey, cancelledKey string
	// newOnly (a create's first send) sends the keys a new job's create
	// touches only, not leasesKey, ownerAliveKey, ownerParkedKey and
	// cancelledKey (create 3 or 4 in activate.lua): a job that is not new
	// answers activateFull, and is sent again with every key.
	newOnly bool

	node        string
	nowMs       int64
	lockTTLMs   int64
	create      bool
	jobID       string
	topic       string
	tenant      string
	traceID     string
	request     []byte
	rescueAtMs  int64
	lockAfter   string // keep, release or terminal
	dueMs       int64  // 0: the rescue time; -1: none; > 0: this time
	parkedOwner string
	plan        planArgs
	// leaseAtMs is the lease's score once the lock is taken, nowMs + 2 ×
	// lockTTLMs, and dueAtMs the due time sent, dueMs with 0 made
	// rescueAtMs (appendArgs sets them: an argument goes to go-redis as a
	// pointer).
	leaseAtMs, dueAtMs int64
}

func (activateCall) script() *redis.Script { return activateScript }
func (c activateCall) keys() []string      { return keyStrings(c.appendKeys(nil)) }
func (c activateCall) args() []interface{} { return c.appendArgs(nil) }

func (c *activateCall) keyCount() int { return c.ownKeys() + c.plan.writeCount() }
func (c *activateCall) argCount() int { return c.keyCount() + 10 + c.plan.argCount() }

// ownKeys is the number of the call's keys before the plan's.
func (c *activateCall) ownKeys() int {
	if c.newOnly {
		return 5
	}
	return 9
}

func (c *activateCall) appendKeys(dst []interface{}) []interface{} {
	dst = append(dst, &c.jobKey, &c.lockKey, &c.dueKey, &c.indexKey, &c.markKey)
	if !c.newOnly {
		dst = append(dst, &c.leasesKey, &c.ownerAliveKey, &c.ownerParkedKey, &c.cancelledKey)
	}
	return c.plan.appendKeys(dst)
}
func (c *activateCall) appendArgs(dst []interface{}) []interface{} {
	c.leaseAtMs, c.dueAtMs = c.nowMs+2*c.lockTTLMs, c.dueAt()
	create := c.createArg()
	// Topic, tenant and trace go only in the packed field (activate.lua's
	// create cancelled by a mark reads them there).
	dst = append(dst, &c.node, &c.nowMs, &c.lockTTLMs, create, &c.jobID, c.request,
		&c.lockAfter, &c.dueAtMs, &c.parkedOwner, &c.leaseAtMs)
	plan := c.plan
	if c.create {
		var fields []string
		if plan.t != nil {
			fields = plan.t.Fields
		}
		plan.packed = packCreate(c.topic, c.tenant, c.traceID, fields)
	}
	return plan.appendArgs(dst)
}

// createArg is activate.lua's ARGV[4]: "1" to create the job, "2" to
// create it with a field whose value is to be the time the write lands
// (jobstate.LandedNow), "3" and "4" the same sending a new job's keys only
// (newOnly), "0" not to.
func (c *activateCall) createArg() string {
	switch {
	case !c.create:
		return "0"
	case c.newOnly && c.plan.landed():
		return "4"
	case c.newOnly:
		return "3"
	case c.plan.landed():
		return "2"
	}
	return "1"
}

// dueAt is the due time activate.lua is sent: dueMs, or rescueAtMs where
// dueMs is 0 (the plan has no due time of its own).
func (c *activateCall) dueAt() int64 {
	if c.dueMs == 0 {
		return c.rescueAtMs
	}
	return c.dueMs
}

// activateParkedBy is the status activateScript answers, changing nothing,
// when another node than the call's parkedOwner parked the job's lock.
const activateParkedBy = "PARKED_BY"

// activateFull is the status activateScript answers, changing nothing, to
// a newOnly call (activateCall.newOnly) of a job that is not new.
const activateFull = "FULL"

// transitionScript (lua/transition.lua) moves a job along a path of states,
// only if it is in one of the expected states and only while the caller's
// lock value is the current one.
var transitionScript = luaScript("transition", "shard_writes", "hops")

// transitionMultiScript is transitionScript for several jobs in one call.
var transitionMultiScript = multiScript("transition", "shard_writes", "hops")

// transitionCall is a call of transitionScript.
type transitionCall struct {
	jobKey, lockKey, dueKey string
	// toIndexKey is the shard's index of the last hop's state;
	// fromIndexKeys the shard's index of each state of expected, in order.
	toIndexKey    string
	fromIndexKeys []string
	fromBuf       [3]string // fromIndexKeys' storage for up to 3 expected states

	lockValue string
	node      string
	expected  string // comma-separated states (see Expect)
	nowMs     int64
	jobID     string
	lockAfter string // keep, release or terminal
	dueMs     int64  // 0: kept; -1: cleared; > 0: this time
	plan      planArgs
}

func (transitionCall) script() *redis.Script { return transitionScript }
func (c transitionCall) keys() []string      { return keyStrings(c.appendKeys(nil)) }
func (c transitionCall) args() []interface{} { return c.appendArgs(nil) }

func (c *transitionCall) keyCount() int { return 4 + len(c.fromIndexKeys) + c.plan.writeCount() }
func (c *transitionCall) argCount() int { return c.keyCount() + 8 + c.plan.argCount() }
func (c *transitionCall) appendKeys(dst []interface{}) []interface{} {
	dst = append(dst, &c.jobKey, &c.lockKey, &c.dueKey, &c.toIndexKey)
	for i := range c.fromIndexKeys {
		dst = append(dst, &c.fromIndexKeys[i])
	}
	return c.plan.appendKeys(dst)
}
func (c *transitionCall) appendArgs(dst []interface{}) []interface{} {
	dst = append(dst, &c.lockValue, &c.node, &c.expected, &c.nowMs, &c.jobID, &c.lockAfter, &c.dueMs, c.plan.landedArg())
	return c.plan.appendArgs(dst)
}

// appendExpectedIndexes appends to dst shard's index key of each state of
// a Transition's Expect, split as transitionScript splits it (the runs of
// characters between commas, empty ones skipped), so the script's n-th
// expected state has the n-th index key.
func appendExpectedIndexes(dst []string, k *Keys, shard int, expect string) []string {
	for rest := expect; rest != ""; {
		st, tail, _ := strings.Cut(rest, ",")
		if st != "" {
			dst = append(dst, k.Index(shard, st))
		}
		rest = tail
	}
	return dst
}

// planArgs is what a Transition gives activateCall and transitionCall: its
// hops, its writes in the job's shard and its record fields (see
// lua/lib/shard_writes.lua for how the scripts read them).
type planArgs struct {
	t *Transition // nil: no hops, no writes, no fields
	// tag is the job's shard's tag, which each write's Suffix follows.
	tag string
	// extra, when set, is one more sorted-set write after t.Adds (the
	// DLQ outbox's).
	extra *ShardZAdd
	// packed, when set, is the fieldPacked value of a record being
	// created: the packable fields among t.Fields are in it, not sent
	// on their own (see packed.go).
	packed string
}

// adds returns the plan's sorted-set writes, in order. Without t there are
// none, extra included.
func (p planArgs) adds() []ShardZAdd {
	if p.t == nil {
		return nil
	}
	adds := p.t.Adds
	if p.extra != nil {
		adds = append(adds[:len(adds):len(adds)], *p.extra)
	}
	return adds
}

func (p planArgs) sets() []ShardHSet {
	if p.t == nil {
		return nil
	}
	return p.t.Sets
}

// landed reports whether a value of the plan's fields is to become the
// time the write lands (jobstate.LandedNow).
func (p planArgs) landed() bool {
	if p.t == nil {
		return false
	}
	for i := 1; i < len(p.t.Fields); i += 2 {
		if p.t.Fields[i] == jobstate.LandedNow {
			return true
		}
	}
	return false
}

// landedArg is landed as transition.lua's ARGV[8].
func (p planArgs) landedArg() string {
	if p.landed() {
		return "1"
	}
	return "0"
}

// writeCount is the number of the plan's write keys.
func (p planArgs) writeCount() int { return len(p.adds()) + len(p.sets()) }

// writeKeys returns the key of each write: the sorted sets', then the
// hashes'.
func (p planArgs) writeKeys() []string {
	adds, sets := p.adds(), p.sets()
	keys := make([]string, 0, len(adds)+len(sets))
	for _, a := range adds {
		keys = append(keys, p.tag+a.Suffix)
	}
	for _, h := range sets {
		keys = append(keys, p.tag+h.Suffix)
	}
	return keys
}

// appendKeys adds writeKeys' keys to dst.
func (p planArgs) appendKeys(dst []interface{}) []interface{} {
	for _, k := range p.writeKeys() {
		dst = append(dst, k)
	}
	return dst
}

// argCount is how many arguments appendArgs adds, at most.
func (p planArgs) argCount() int {
	if p.t == nil {
		return 5
	}
	return 7 + 2*len(p.t.Path) + 4*len(p.adds()) + 3*len(p.t.Sets) + len(p.t.Fields)
}

// appendArgs adds "n, (to, reason)×n, m, (score, member, trim_below,
// ttl_ms)×m, h, (field, value, ttl_ms)×h, field, value, ..." to args; the
// fields end with "op", t.Op when t.Op is set.
func (p planArgs) appendArgs(args []interface{}) []interface{} {
	if p.t == nil {
		args = append(args, 0, 0, 0)
		if p.packed != "" {
			args = append(args, fieldPacked, p.packed)
		}
		return args
	}
	t := p.t
	// Pointers into the Transition (and its adds), which outlive the
	// write: no interface value to allocate per argument. A count and a
	// TTL are small numbers, which box without allocating.
	args = append(args, len(t.Path))
	for i := range t.Path {
		args = append(args, (*string)(&t.Path[i].To), (*string)(&t.Path[i].Reason))
	}
	adds := p.adds()
	args = append(args, len(adds))
	for i := range adds {
		a := &adds[i]
		args = append(args, &a.Score, &a.Member, &a.TrimBelow, a.TTL.Milliseconds())
	}
	args = append(args, len(t.Sets))
	for i := range t.Sets {
		h := &t.Sets[i]
		args = append(args, &h.Field, &h.Value, h.TTL.Milliseconds())
	}
	if p.packed == "" {
		for i := range t.Fields {
			args = append(args, &t.Fields[i])
		}
	} else {
		for i := 0; i+1 < len(t.Fields); i += 2 {
			if !packable(t.Fields[i]) {
				args = append(args, &t.Fields[i], &t.Fields[i+1])
			}
		}
		args = append(args, fieldPacked, p.packed)
	}
	if t.Op != "" {
		args = append(args, "op", &t.Op)
	}
	return args
}

// releaseScript (lua/release.lua) gives a job's lock up, and its lease,
// if the caller still holds the lock.
var releaseScript = luaScript("release")

type releaseCall struct {
	lockKey, leasesKey, dueKey string
	lockValue, jobID           string
}

func (releaseCall) script() *redis.Script { return releaseScript }
func (c releaseCall) keys() []string      { return []string{c.lockKey, c.leasesKey, c.dueKey} }
func (c releaseCall) args() []interface{} { return []interface{}{c.lockValue, c.jobID} }

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

// cancelMarkScript (lua/cancel_mark.lua) records a cancel of a job that
// has no record yet, or says that it has one.
var cancelMarkScript = luaScript("cancel_mark")

type cancelMarkCall struct {
	jobKey, markKey string
	by, reason      string
	ttlMs           int64
	tenants         []string
}

func (cancelMarkCall) script() *redis.Script { return cancelMarkScript }
func (c cancelMarkCall) keys() []string      { return []string{c.jobKey, c.markKey} }
func (c cancelMarkCall) args() []interface{} {
	out := []interface{}{c.by, c.reason, c.ttlMs}
	for _, t := range c.tenants {
		out = append(out, t)
	}
	return out
}

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
	leasesKey  string // dueScoresScript's second key
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
func (c dueCall) keys() []string {
	if c.withScores {
		return []string{c.setKey, c.leasesKey}
	}
	return []string{c.setKey}
}
func (c dueCall) args() []interface{} { return []interface{}{c.cutoffMs, c.limit, c.laterMs} }

// trimScript (lua/trim.lua) deletes the records of jobs read from a
// shard's terminal-state index whose retention has passed, with their
// entries.
var trimScript = luaScript("trim")

type trimCall struct {
	indexKey string
	jobKeys  []string // the records of jobIDs, in order
	jobIDs   []string
}

func (trimCall) script() *redis.Script { return trimScript }
func (c trimCall) keys() []string      { return append([]string{c.indexKey}, c.jobKeys...) }
func (c trimCall) args() []interface{} {
	a := make([]interface{}, 0, len(c.jobIDs))
	for _, id := range c.jobIDs {
		a = append(a, id)
	}
	return a
}

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
// and their leases, in one call: each lock only while its caller still
// holds it.
//
// The lease (a per-shard sorted set, score = when the owner must have
// renewed by) is what makes a dead owner visible: when a node dies its
// leases stop moving, and the due poller wakes every job whose lease ran
// out, so another replica adopts it without waiting for a result or a
// deadline.
var renewManyScript = luaScript("renew_many")

// renewManyCall renews locks, all of one shard.
type renewManyCall struct {
	dueKey       string // the shard's due set, which holds the leases
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
	keys = append(keys, c.dueKey)
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
var downgradeScript = luaScript("downgrade", "hops")

type downgradeCall struct {
	jobKey, fromIndexKey, toIndexKey string
	nowMs                            int64
	reason, node, jobID              string
	fields                           []string // field, value, ...
}

func (downgradeCall) script() *redis.Script { return downgradeScript }
func (c downgradeCall) keys() []string {
	return []string{c.jobKey, c.fromIndexKey, c.toIndexKey}
}
func (c downgradeCall) args() []interface{} {
	args := make([]interface{}, 0, 4+len(c.fields))
	args = append(args, c.nowMs, c.reason, c.node, c.jobID)
	for _, f := range c.fields {
		args = append(args, f)
	}
	return args
}

// allScripts are the scripts LoadScripts loads: those sent with EVALSHA in
// pipelines. The DLQ scripts go with EVAL, and the lease scripts with
// Script.Run, which needs no prior load.
var allScripts = []*redis.Script{downgradeScript, admitScript, activateScript, transitionScript, releaseScript,
	approveScript, claimScript, cancelMarkScript, dueScript, dueScoresScript, trimScript, parkScript, renewManyScript, deadNodeScript}
