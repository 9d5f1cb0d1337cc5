//go:build conformance

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// The simulator's store (sim.apply, sim_model_test.go) is a Go model of the
// Lua scripts. TestSimStoreConformance keeps it honest: the same seeded
// random sequences of store operations — activations (create, with and
// without a plan, adoption, BUSY, TERMINAL, NOTFOUND, parked locks of live
// and dead nodes), transitions (fenced, conflicting, releasing, terminal,
// with due times, tenant releases and DLQ entries), releases, parks, tenant
// admissions, idempotency claims, DLQ entries, a lock expiring, a node's
// lease lapsing — go to the model and, through the store's Writer, to the
// real scripts (real Redis, or the embedded store), and every reply and the
// resulting keys (record state, fence, op, reason and the fields the core
// reads back, lock, due, lease, parked and tenant entries, idempotency
// claims, DLQ length) must agree.
//
// It needs Redis, which the core's tests otherwise do not: it builds only
// with the conformance tag (make conformance; make test runs it), so that
// `go list -test -deps ./internal/lifecycle` names no store or Redis package.

const (
	confTenant = "conf"
	confJobs   = 3
)

// confNodes are the nodes the operations come from.
var confNodes = []string{"n0", "n1", "n2"}

// confFields are the record fields the core reads back on adoption (adopt,
// resumeApproval, activated), compared between model and Redis.
var confFields = []string{"reason", "op", "worker", "subj", "attempts", "deadline", "deadline_kind",
	"tslot", "resend", "sod", "lost_workers", "runner", "req", "trace", "created", "job_hash",
	"approval_decision", "approval_hash", "approval_by", "last_reason"}

// confStates are the states transitions expect and go to.
var confStates = []jobstate.State{jobstate.StatePending, jobstate.StateScheduled, jobstate.StateApprovalRequired,
	jobstate.StateDispatched, jobstate.StateRunning, jobstate.StateSucceeded, jobstate.StateFailed, jobstate.StateCancelled}

type conformance struct {
	t    *testing.T
	ctx  context.Context
	st   *store.Store
	w    *store.Writer
	rdb  redis.UniversalClient
	seq  int
	rng  *rand.Rand
	m    *sim
	jobs []string
	ops  []string // what ran, for the failure's report
	// dlqBase: the DLQ stream's length before the sequence (the stream is
	// shared by every sequence).
	dlqBase int64
}

func TestSimStoreConformance(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	st := store.New(env.Client, store.Config{Prefix: env.KeyPrefix(), LockTTL: simLockTTL, RescueAfter: simRescue,
		Retention: time.Hour})
	ctx := context.Background()
	if err := st.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	w := st.NewWriter(1, 16, 64)
	defer w.Close()
	sequences, steps := envInt("TROUPE_SIM_CONFORMANCE_SEQS", 300), envInt("TROUPE_SIM_CONFORMANCE_OPS", 30)
	ops := 0
	for seq := 1; seq <= sequences && !t.Failed(); seq++ {
		c := &conformance{t: t, ctx: ctx, st: st, w: w, rdb: env.Client, seq: seq,
			rng: rand.New(rand.NewPCG(uint64(seq), 0x5eed)), m: newSim(t, uint64(seq))}
		c.m.faults = false
		for i := range confJobs {
			c.jobs = append(c.jobs, fmt.Sprintf("c%d-%d", seq, i))
		}
		c.setAlive(confNodes...)
		c.dlqBase = env.Client.XLen(ctx, st.Keys().DLQ()).Val()
		for range steps {
			if !c.step() {
				break
			}
			ops++
		}
	}
	t.Logf("%d sequences, %d store operations compared", sequences, ops)
}

// step runs one random operation on both sides and compares; false when
// they disagreed (the test has failed).
func (c *conformance) step() bool {
	now := time.Now()
	c.m.now = now
	job := c.jobs[c.rng.IntN(len(c.jobs))]
	var op *Op
	switch r := c.rng.IntN(100); {
	case r < 22:
		op = c.activateOp(job)
	case r < 55:
		op = c.transitionOp(job)
	case r < 62:
		op = &Op{Kind: OpRelease, JobID: job, LockValue: c.lockChoice(job)}
	case r < 70:
		// A node parks with its own lock value. Not from a node whose
		// lease lapsed: the script would set its lease again (SET NX),
		// while the model's node with no lease is dead and acts no more.
		lv := c.lockChoice(job)
		node, _, _ := strings.Cut(lv, "|")
		if !c.m.node(node).alive {
			node = c.aliveNode()
			lv = jobstate.LockValue(node, max(c.m.recs[job].fenceOr(1), 1))
		}
		due := int64(0)
		if c.rng.IntN(3) > 0 {
			due = now.Add(time.Duration(c.rng.IntN(600)) * time.Second).UnixMilli()
		}
		op = &Op{Kind: OpPark, JobID: job, Node: node, LockValue: lv, ParkDue: due}
	case r < 76:
		op = &Op{Kind: OpAdmit, JobID: job, TenantKey: c.tenantKey(), Limit: 1 + c.rng.IntN(2)}
	case r < 81:
		op = &Op{Kind: OpClaim, JobID: job, IdemKey: c.idemKey(c.rng.IntN(2))}
	case r < 84:
		op = &Op{Kind: OpDLQ, JobID: job, DLQ: c.dlqEntry(job)}
	case r < 88:
		lv := c.lockChoice(job)
		want := c.m.renew(job, lv)
		return c.compareRenew(job, lv, want)
	case r < 92:
		c.expireLock(job)
		return c.compare("lock of "+job+" expires", nil, nil, nil)
	case r < 96:
		n := confNodes[c.rng.IntN(len(confNodes))]
		c.m.node(n).alive = false
		c.delAlive(n)
		return c.compare("lease of "+n+" lapses", nil, nil, nil)
	default:
		n := confNodes[c.rng.IntN(len(confNodes))]
		c.m.node(n).alive = true
		c.setAlive(n)
		return c.compare("lease of "+n+" renewed", nil, nil, nil)
	}
	if op.Kind == OpActivate || op.Kind == OpTransition {
		if op.Node == "" || !c.m.node(op.Node).alive {
			op.Node = c.aliveNode()
		}
	}
	n := c.m.node(op.Node)
	if n == nil {
		n = c.m.nodes[0]
	}
	want := c.m.apply(n, op)
	c.m.failures = nil // the simulator's hop rules are its own invariants, not the scripts'
	got := c.real(op)
	return c.compare(describeOp(op), op, want, got)
}

func (c *conformance) aliveNode() string {
	var alive []string
	for _, n := range confNodes {
		if c.m.node(n).alive {
			alive = append(alive, n)
		}
	}
	if len(alive) == 0 {
		c.m.node("n0").alive = true
		c.setAlive("n0")
		return "n0"
	}
	return alive[c.rng.IntN(len(alive))]
}

// lockChoice is a lock value an operation presents: the job's own (what its
// owner holds), a stale or another node's, or none.
func (c *conformance) lockChoice(job string) string {
	r := c.m.recs[job]
	cur := ""
	if r != nil {
		cur = strings.TrimSuffix(r.lock, "|p")
	}
	switch x := c.rng.IntN(10); {
	case x < 6 && cur != "":
		return cur
	case x < 8 && r != nil:
		return jobstate.LockValue(confNodes[c.rng.IntN(len(confNodes))], max(r.fence-int64(c.rng.IntN(2)), 1))
	default:
		return jobstate.LockValue(confNodes[c.rng.IntN(len(confNodes))], 1)
	}
}

func (c *conformance) activateOp(job string) *Op {
	node := c.aliveNode()
	if r := c.m.recs[job]; r != nil && r.lock != "" && c.rng.IntN(2) == 0 {
		// The owner itself, as a restarted actor does.
		node, _, _ = strings.Cut(r.lock, "|")
	}
	op := &Op{Kind: OpActivate, JobID: job, Node: node, Create: c.rng.IntN(3) > 0,
		Topic: "job.sim", Tenant: confTenant, TraceID: "tr-" + job, Request: []byte("req-" + job)}
	if op.Create && c.rng.IntN(3) > 0 {
		op.T = c.transition(job, true)
		if c.rng.IntN(4) == 0 {
			op.DLQ = c.dlqEntry(job)
		}
	}
	return op
}

func (c *conformance) transitionOp(job string) *Op {
	lv := c.lockChoice(job)
	node, _, _ := strings.Cut(lv, "|")
	op := &Op{Kind: OpTransition, JobID: job, Node: node, LockValue: lv, T: c.transition(job, false)}
	if c.rng.IntN(5) == 0 {
		op.TenantRelease = c.tenantKey()
	}
	if c.rng.IntN(6) == 0 {
		op.DLQ = c.dlqEntry(job)
	}
	return op
}

// transition is a random transition, as the core writes them (always with
// an op id; the plan of a created job expects nothing).
func (c *conformance) transition(job string, plan bool) *jobstate.Transition {
	t := &jobstate.Transition{Op: strconv.FormatUint(c.rng.Uint64(), 36)}
	if !plan {
		e := []jobstate.State{confStates[c.rng.IntN(len(confStates))]}
		if c.rng.IntN(2) == 0 {
			e = append(e, confStates[c.rng.IntN(len(confStates))])
		}
		if r := c.m.recs[job]; r != nil && c.rng.IntN(3) > 0 {
			e = append(e, r.state) // mostly one that applies
		}
		t.Expect = jobstate.Expect(e...)
	}
	for range 1 + c.rng.IntN(2) {
		to := confStates[c.rng.IntN(len(confStates))]
		if c.rng.IntN(3) > 0 {
			to = confStates[c.rng.IntN(5)] // mostly live states: longer sequences
		}
		t.Path = append(t.Path, jobstate.Hop{To: to, Reason: jobstate.Reason("r" + strconv.Itoa(c.rng.IntN(4)))})
	}
	switch c.rng.IntN(4) {
	case 0:
		t.Due = -1
	case 1:
		t.Due = time.Now().Add(time.Duration(1+c.rng.IntN(600)) * time.Second).UnixMilli()
	}
	t.Release = c.rng.IntN(5) == 0
	for range c.rng.IntN(4) {
		f := confFields[2+c.rng.IntN(len(confFields)-2)] // not reason or op: the scripts own them
		v := "v" + strconv.Itoa(c.rng.IntN(3))
		if f == "deadline" || f == "created" {
			v = strconv.FormatInt(time.Now().Add(time.Duration(c.rng.IntN(600))*time.Second).UnixMilli(), 10)
		}
		t.Fields = append(t.Fields, f, v)
	}
	return t
}

func (c *conformance) dlqEntry(job string) *jobstate.DLQEntry {
	return &jobstate.DLQEntry{JobID: job, Topic: "job.sim", Reason: jobstate.ReasonUnknownJob, Message: "conformance"}
}

func (c *conformance) tenantKey() string {
	return c.st.Keys().TenantActive(confTenant + strconv.Itoa(c.seq))
}

func (c *conformance) idemKey(k int) string {
	return c.st.Keys().Idempotency(confTenant, strconv.Itoa(c.seq)+"-"+strconv.Itoa(k))
}

// expireLock lets the job's lock lapse (a TTL lock; a parked one has none).
func (c *conformance) expireLock(job string) {
	r := c.m.recs[job]
	if r == nil || r.lock == "" || r.parkedBy != "" {
		return
	}
	r.lockExp = c.m.now.Add(-time.Millisecond)
	if err := c.rdb.Del(c.ctx, c.st.Keys().Lock(job)).Err(); err != nil {
		c.t.Fatal(err)
	}
}

func (c *conformance) aliveKeys(node string) []string {
	var keys []string
	for _, j := range c.jobs {
		keys = append(keys, c.st.Keys().Alive(store.Shard(j), node))
	}
	return keys
}

func (c *conformance) setAlive(nodes ...string) {
	for _, n := range nodes {
		for _, k := range c.aliveKeys(n) {
			if err := c.rdb.Set(c.ctx, k, "1", time.Minute).Err(); err != nil {
				c.t.Fatal(err)
			}
		}
	}
}

func (c *conformance) delAlive(node string) {
	if err := c.rdb.Del(c.ctx, c.aliveKeys(node)...).Err(); err != nil {
		c.t.Fatal(err)
	}
}

// real runs op through the store's Writer (the scripts).
func (c *conformance) real(op *Op) *WriteResult {
	ch := make(chan *WriteResult, 1)
	// As the shell does (jobactor/ops.go): the core's write as a store op,
	// its outcome back as the core's.
	kinds := map[OpKind]store.OpKind{OpActivate: store.OpActivate, OpTransition: store.OpTransition,
		OpRelease: store.OpRelease, OpDLQ: store.OpDLQ, OpClaim: store.OpClaim, OpAdmit: store.OpAdmit,
		OpPark: store.OpPark}
	sop := &store.Op{Kind: kinds[op.Kind], JobID: op.JobID, Node: op.Node, LockValue: op.LockValue,
		Create: op.Create, Topic: op.Topic, Tenant: op.Tenant, TraceID: op.TraceID, Request: op.Request,
		T: op.T, DLQ: op.DLQ, TenantRelease: op.TenantRelease,
		IdemKey: op.IdemKey, TenantKey: op.TenantKey, Limit: op.Limit, ParkDue: op.ParkDue}
	sop.Done = func(r *store.Result) {
		ch <- &WriteResult{Err: r.Err, Status: ActivateStatus(r.Status), State: r.State, Fence: r.Fence,
			Holder: r.Holder, Fields: r.Fields, Step: StepStatus(r.Step), Before: r.Before, LastOp: r.LastOp,
			Released: r.Released, Admitted: r.Admitted, Parked: r.Parked}
	}
	c.w.Submit(sop)
	select {
	case r := <-ch:
		if r.Err != nil {
			c.t.Fatalf("sequence %d: %s: %v", c.seq, describeOp(op), r.Err)
		}
		return r
	case <-time.After(10 * time.Second):
		c.t.Fatalf("sequence %d: %s timed out", c.seq, describeOp(op))
	}
	return nil
}

func describeOp(op *Op) string {
	b := &strings.Builder{}
	fmt.Fprintf(b, "%s %s node=%s lock=%q", opName(op.Kind), op.JobID, op.Node, op.LockValue)
	switch op.Kind {
	case OpActivate:
		fmt.Fprintf(b, " create=%v", op.Create)
	case OpAdmit:
		fmt.Fprintf(b, " limit=%d", op.Limit)
	case OpPark:
		fmt.Fprintf(b, " due=%d", op.ParkDue)
	}
	if t := op.T; t != nil {
		fmt.Fprintf(b, " expect=%s path=%v due=%d release=%v fields=%v", t.Expect, t.Path, t.Due, t.Release, t.Fields)
	}
	if op.DLQ != nil {
		b.WriteString(" +dlq")
	}
	if op.TenantRelease != "" {
		b.WriteString(" +tenant-release")
	}
	return b.String()
}

func opName(k OpKind) string {
	return map[OpKind]string{OpActivate: "activate", OpTransition: "transition",
		OpRelease: "release", OpDLQ: "dlq", OpClaim: "claim", OpAdmit: "admit",
		OpPark: "park"}[k]
}

// compare checks the reply (when op ran) and every key the model has.
func (c *conformance) compare(what string, op *Op, want, got *WriteResult) bool {
	c.ops = append(c.ops, what)
	var diffs []string
	diff := func(format string, args ...any) { diffs = append(diffs, fmt.Sprintf(format, args...)) }
	if op != nil {
		c.compareReply(op, want, got, diff)
	}
	c.compareKeys(diff)
	if len(diffs) == 0 {
		return true
	}
	c.t.Errorf("sequence %d (TROUPE_SIM_CONFORMANCE_SEQS reaches it), after %s:\n  %s\nthe operations:\n  %s",
		c.seq, what, strings.Join(diffs, "\n  "), strings.Join(c.ops, "\n  "))
	return false
}

func (c *conformance) compareReply(op *Op, want, got *WriteResult, diff func(string, ...any)) {
	type pair struct {
		name      string
		want, got any
	}
	var ps []pair
	switch op.Kind {
	case OpActivate:
		ps = append(ps, pair{"status", want.Status, got.Status}, pair{"state", want.State, got.State},
			pair{"fence", want.Fence, got.Fence}, pair{"holder", want.Holder, got.Holder})
		if want.Status == ActivateAdopted {
			for _, f := range confFields {
				w, g := want.Fields[f], got.Fields[f]
				if f == "created" && closeMs(w, g) {
					continue
				}
				ps = append(ps, pair{"field " + f, w, g})
			}
		}
	case OpTransition:
		ps = append(ps, pair{"step", want.Step, got.Step}, pair{"before", want.Before, got.Before})
		if want.Step != StepOK {
			ps = append(ps, pair{"last op", want.LastOp, got.LastOp})
		}
		if want.Step == StepFenced {
			ps = append(ps, pair{"state", want.State, got.State})
		}
	case OpRelease:
		ps = append(ps, pair{"released", want.Released, got.Released})
	case OpPark:
		ps = append(ps, pair{"parked", want.Parked, got.Parked})
	case OpAdmit:
		ps = append(ps, pair{"admitted", want.Admitted, got.Admitted})
	case OpClaim:
		ps = append(ps, pair{"holder", want.Holder, got.Holder})
	}
	for _, p := range ps {
		if p.want != p.got {
			diff("reply %s: model %v, scripts %v", p.name, p.want, p.got)
		}
	}
}

// closeMs: two unix-ms times within a second (the model's clock and the
// store's are read a moment apart).
func closeMs(a, b string) bool {
	x, errA := strconv.ParseInt(a, 10, 64)
	y, errB := strconv.ParseInt(b, 10, 64)
	return errA == nil && errB == nil && x-y < 1000 && y-x < 1000
}

// compareKeys reads every job's keys from Redis in one pipeline and checks
// them against the model.
func (c *conformance) compareKeys(diff func(string, ...any)) {
	k := c.st.Keys()
	pipe := c.rdb.Pipeline()
	fields := append([]string{"s", "fence"}, confFields...)
	type jobCmds struct {
		rec            *redis.MapStringStringCmd
		lock           *redis.StringCmd
		due, lease, tn *redis.FloatCmd
		parked         []*redis.FloatCmd
	}
	cmds := make([]jobCmds, len(c.jobs))
	for i, j := range c.jobs {
		sh := store.Shard(j)
		cmds[i] = jobCmds{rec: pipe.HGetAll(c.ctx, k.Job(j)), lock: pipe.Get(c.ctx, k.Lock(j)),
			due: pipe.ZScore(c.ctx, k.Due(sh), j), lease: pipe.ZScore(c.ctx, k.Due(sh), store.LeaseMember(j)),
			tn: pipe.ZScore(c.ctx, c.tenantKey(), j)}
		for _, n := range confNodes {
			cmds[i].parked = append(cmds[i].parked, pipe.ZScore(c.ctx, k.Parked(sh, n), j))
		}
	}
	idem := []*redis.StringCmd{pipe.Get(c.ctx, c.idemKey(0)), pipe.Get(c.ctx, c.idemKey(1))}
	dlqLen := pipe.XLen(c.ctx, k.DLQ())
	if _, err := pipe.Exec(c.ctx); err != nil && !errors.Is(err, redis.Nil) {
		c.t.Fatal(err)
	}
	score := func(cmd *redis.FloatCmd) (int64, bool) {
		v, err := cmd.Result()
		return int64(v), err == nil
	}
	for i, j := range c.jobs {
		r := c.m.recs[j]
		// The record as its readers see it: the fields a create packs or
		// leaves out put back (store.ExpandRecord).
		all := cmds[i].rec.Val()
		store.ExpandRecord(all)
		got := map[string]string{}
		for _, f := range fields {
			if s, ok := all[f]; ok {
				got[f] = s
			}
		}
		lock, _ := cmds[i].lock.Result()
		due, hasDue := score(cmds[i].due)
		_, hasLease := score(cmds[i].lease)
		_, hasTenant := score(cmds[i].tn)
		if wantT := c.m.tenant[j]; wantT != hasTenant {
			diff("%s: tenant slot: model %v, scripts %v", j, wantT, hasTenant)
		}
		if r == nil {
			if got["s"] != "" || lock != "" || hasDue || hasLease {
				diff("%s: model has no record; scripts have state %q, lock %q, due %v, lease %v", j, got["s"], lock, hasDue, hasLease)
			}
			continue
		}
		if string(r.state) != got["s"] {
			diff("%s: state: model %s, scripts %s", j, r.state, got["s"])
		}
		if strconv.FormatInt(r.fence, 10) != got["fence"] {
			diff("%s: fence: model %d, scripts %s", j, r.fence, got["fence"])
		}
		if r.op != got["op"] {
			diff("%s: op: model %q, scripts %q", j, r.op, got["op"])
		}
		for _, f := range confFields {
			if f == "op" {
				continue
			}
			w, g := r.fields[f], got[f]
			if w != g && !(f == "created" && closeMs(w, g)) {
				diff("%s: field %s: model %q, scripts %q", j, f, w, g)
			}
		}
		wantLock := r.lock
		if r.parkedBy == "" && !c.m.now.Before(r.lockExp) {
			wantLock = "" // lapsed
		}
		if wantLock != lock {
			diff("%s: lock: model %q, scripts %q", j, wantLock, lock)
		}
		if (r.due > 0) != hasDue || hasDue && r.due != due && !closeMs(strconv.FormatInt(r.due, 10), strconv.FormatInt(due, 10)) {
			diff("%s: due: model %d, scripts %d (%v)", j, r.due, due, hasDue)
		}
		if r.lease != hasLease {
			diff("%s: lease entry: model %v, scripts %v", j, r.lease, hasLease)
		}
		for x, n := range confNodes {
			ps, parked := score(cmds[i].parked[x])
			if wantP := r.parkedBy == n; wantP != parked {
				diff("%s: in %s's parked set: model %v, scripts %v", j, n, wantP, parked)
			} else if parked {
				if d := store.NeverDue; r.fields["park_due"] != "0" && r.fields["park_due"] != strconv.FormatInt(ps, 10) ||
					r.fields["park_due"] == "0" && ps != d {
					diff("%s: parked due: model %s, scripts %d", j, r.fields["park_due"], ps)
				}
			}
		}
	}
	for x, cmd := range idem {
		w := c.m.idem[c.idemKey(x)]
		if g, _ := cmd.Result(); g != w {
			diff("idempotency key %d: model %q, scripts %q", x, w, g)
		}
	}
	if n := dlqLen.Val() - c.dlqBase; n != int64(c.m.dlq) {
		diff("DLQ entries: model %d, scripts %d", c.m.dlq, n)
	}
}

func (r *simRec) fenceOr(def int64) int64 {
	if r == nil {
		return def
	}
	return r.fence
}

// compareRenew renews lv through the store's lock renewer (renew_many.lua)
// and compares its outcome with the model's (1 renewed, 0 another's, -1
// none), then the keys.
func (c *conformance) compareRenew(job, lv string, want int) bool {
	rn := c.st.NewLockRenewer(nil)
	got := 1
	rn.Hold(job, lv, func(vanished bool) {
		got = 0
		if vanished {
			got = -1
		}
	})
	rn.RenewOnce(c.ctx)
	rn.Forget(job, lv)
	what := fmt.Sprintf("renew %s lock=%q", job, lv)
	if got != want {
		c.t.Errorf("sequence %d, after %s: model %d, scripts %d\nthe operations:\n  %s", c.seq, what, want, got,
			strings.Join(c.ops, "\n  "))
		return false
	}
	return c.compare(what, nil, nil, nil)
}
