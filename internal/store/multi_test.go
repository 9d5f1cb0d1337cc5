package store

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/testenv"
)

// execBatch runs ops as one flush of the writer (Writer.exec) and returns
// their results in order.
func execBatch(t *testing.T, w *Writer, ops []*Op) []*Result {
	t.Helper()
	results := make([]*Result, len(ops))
	for i, op := range ops {
		i := i
		op.Done = func(r *Result) { results[i] = r }
	}
	w.exec(ops)
	for i, r := range results {
		if r == nil {
			t.Fatalf("op %d (%s) got no result", i, ops[i].JobID)
		}
	}
	return results
}

// oneShardIDs returns n job ids of one shard, so that they are grouped on
// Redis Cluster too (faults/TestRedisCluster runs this package's tests on
// one).
func oneShardIDs(t *testing.T, prefix string, n int) []string {
	t.Helper()
	var ids []string
	for i := 0; len(ids) < n && i < 100*Shards; i++ {
		if id := prefix + strconv.Itoa(i); Shard(id) == Shard(prefix+"0") {
			ids = append(ids, id)
		}
	}
	if len(ids) < n {
		t.Fatalf("found %d ids of one shard", len(ids))
	}
	return ids
}

// multiCallWriter is a store with its scripts loaded and a writer over it,
// on a server whose Lua keeps one job's failure to it (the test is skipped
// on the embedded store, which mis-runs a multi-job call after one job
// failed and so gets none: TestMultiCallsAreNotMadeWhereOneJobsFailureSpreads).
func multiCallWriter(t *testing.T) (*testenv.Env, *Store, *Writer) {
	t.Helper()
	env, s := loadedStore(t)
	if s.single {
		t.Skip("the server's Lua does not keep one job's failure to it: no multi-job calls")
	}
	return env, s, &Writer{s: s, timeout: WriterTimeoutDefault}
}

// TestMultiCallResultsArePerJob sends jobs' activations, then their
// transitions, in one flush each, which the writer groups into one call of
// the multi-job script, and checks that every job gets its own outcome: a
// stale fence, an unexpected state and a failing command (the lock key of
// the wrong type) each change that job's result only; the others apply.
func TestMultiCallResultsArePerJob(t *testing.T) {
	t.Parallel()
	env, s, w := multiCallWriter(t)
	ctx := context.Background()
	const n = 6
	ids := oneShardIDs(t, "multi-", n)
	var acts []*Op
	for i := range ids {
		acts = append(acts, &Op{Kind: OpActivate, JobID: ids[i], Node: "a", Create: true, Topic: "job.x",
			Tenant: "t", TraceID: "tr", Request: []byte("req"),
			T: &Transition{Path: []Hop{{To: jobstate.StateScheduled, Reason: "r"}}, Op: "c" + ids[i]}})
	}
	if u := s.units(acts); len(u) != 1 || len(u[0]) != n {
		t.Fatalf("the activations make %d units, want one of %d", len(u), n)
	}
	for i, r := range execBatch(t, w, acts) {
		if r.Err != nil || r.Status != ActivateCreated || r.State != jobstate.StateScheduled || r.Fence != 1 {
			t.Fatalf("activation of %s: %+v", ids[i], r)
		}
	}
	// Job 4's lock becomes a hash: its script's GET fails.
	if err := env.Client.Del(ctx, s.keys.Lock(ids[4])).Err(); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.HSet(ctx, s.keys.Lock(ids[4]), "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	step := func(id string, fence int64, from jobstate.State) *Op {
		return &Op{Kind: OpTransition, JobID: id, Node: "a", LockValue: jobstate.LockValue("a", fence),
			T: &Transition{Expect: jobstate.Expect(from), Path: []Hop{{To: jobstate.StateDispatched, Reason: "r"}},
				Op: "t" + id}}
	}
	steps := []*Op{
		step(ids[0], 1, jobstate.StateScheduled),
		step(ids[1], 2, jobstate.StateScheduled), // a stale (here: unknown) fence
		step(ids[2], 1, jobstate.StateScheduled),
		step(ids[3], 1, jobstate.StatePending), // not the job's state
		step(ids[4], 1, jobstate.StateScheduled),
		step(ids[5], 1, jobstate.StateScheduled),
	}
	if u := s.units(steps); len(u) != 1 || len(u[0]) != n {
		t.Fatalf("the transitions make %d units, want one of %d", len(u), n)
	}
	res := execBatch(t, w, steps)
	for _, i := range []int{0, 2, 5} {
		if r := res[i]; r.Err != nil || r.Step != StepOK || r.Before != jobstate.StateScheduled {
			t.Errorf("transition of %s: %+v, want OK from SCHEDULED", ids[i], r)
		}
	}
	if r := res[1]; r.Err != nil || r.Step != StepFenced || r.Before != "a|1" {
		t.Errorf("stale-fenced transition: %+v, want FENCED by a|1", r)
	}
	if r := res[3]; r.Err != nil || r.Step != StepConflict || r.Before != jobstate.StateScheduled || r.LastOp != "c"+ids[3] {
		t.Errorf("transition from an unexpected state: %+v, want CONFLICT", r)
	}
	if r := res[4]; r.Err == nil {
		t.Errorf("transition with a failing command: %+v, want its error", r)
	}
	for i, want := range []jobstate.State{jobstate.StateDispatched, jobstate.StateScheduled, jobstate.StateDispatched,
		jobstate.StateScheduled, jobstate.StateScheduled, jobstate.StateDispatched} {
		st, err := env.Client.HGet(ctx, s.keys.Job(ids[i]), "s").Result()
		if err != nil {
			t.Fatal(err)
		}
		if jobstate.State(st) != want {
			t.Errorf("%s is %s, want %s", ids[i], st, want)
		}
	}
}

// TestMultiCallsOnClusterStayInOneSlot checks the grouping for Redis
// Cluster: jobs are grouped only with jobs of their shard, so every
// multi-job call names the keys of one hash slot; without a cluster they
// are grouped whatever their shards, up to multiMax a call.
func TestMultiCallsOnClusterStayInOneSlot(t *testing.T) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}) // never dialled
	defer cc.Close()
	s := New(cc, Config{Prefix: "slots:"})
	if !s.cluster {
		t.Fatal("a store over a cluster client does not know it")
	}
	var ops []*Op
	for i := 0; i < 300; i++ {
		id := fmt.Sprintf("job-%d", i)
		plan := &Transition{Expect: jobstate.Expect(jobstate.StateScheduled),
			Path: []Hop{{To: jobstate.StateDispatched, Reason: "r"}}, Fields: []string{"worker", "w"}, Op: "o",
			Adds: []ShardZAdd{{Suffix: "saga:triggers", Score: 2, Member: "wf"}}}
		ops = append(ops, &Op{Kind: OpActivate, JobID: id, Node: "a", Create: true, T: plan, DLQ: &DLQEntry{JobID: id}},
			&Op{Kind: OpTransition, JobID: id, Node: "a", LockValue: "a|1", T: plan},
			&Op{Kind: OpRelease, JobID: id, Node: "a", LockValue: "a|1"})
	}
	pipe := cc.Pipeline()
	grouped := 0
	for _, unit := range s.units(ops) {
		for _, op := range unit[1:] {
			if Shard(op.JobID) != Shard(unit[0].JobID) || op.Kind != unit[0].Kind {
				t.Fatalf("a unit mixes %s (shard %d, kind %d) with %s (shard %d, kind %d)", unit[0].JobID,
					Shard(unit[0].JobID), unit[0].Kind, op.JobID, Shard(op.JobID), op.Kind)
			}
		}
		cmds := s.queueUnit(context.Background(), pipe, unit)
		if len(unit) > 1 {
			grouped++
			checkOneSlot(t, fmt.Sprintf("a call of %d jobs", len(unit)), scriptKeys(t, cmds[0]))
		}
	}
	if grouped == 0 {
		t.Fatal("no jobs were grouped")
	}
	s.cluster = false
	units := s.units(ops)
	if want := 300 + 2*((300+multiMax-1)/multiMax); len(units) != want {
		t.Errorf("without a cluster: %d units, want %d", len(units), want)
	}
}

// failScriptsOnce answers NOSCRIPT, without sending them, to the EVALSHAs
// of the first pipeline that has any, and counts the EVALSHAs sent after.
type failScriptsOnce struct {
	mu    sync.Mutex
	fired bool
	sent  int
}

type noScriptReply struct{}

func (noScriptReply) Error() string { return "NOSCRIPT No matching script. Please use EVAL." }
func (noScriptReply) RedisError()   {}

func (h *failScriptsOnce) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *failScriptsOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *failScriptsOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		fire := !h.fired
		var pass []redis.Cmder
		for _, c := range cmds {
			switch {
			case c.Name() != "evalsha":
				pass = append(pass, c)
			case fire:
				c.SetErr(noScriptReply{})
				h.fired = true
			default:
				h.sent++
				pass = append(pass, c)
			}
		}
		h.mu.Unlock()
		var err error
		if len(pass) > 0 {
			err = next(ctx, pass)
		}
		if fire && err == nil {
			err = noScriptReply{}
		}
		return err
	}
}

// TestMultiCallIsSentAgainAfterNoScript checks that a multi-job call that
// Redis answers NOSCRIPT (its script not in the cache: a restart, a SCRIPT
// FLUSH) is sent once more after the scripts are loaded, and every job of
// it applies.
func TestMultiCallIsSentAgainAfterNoScript(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	if env.RedisEmbedded() {
		t.Skip("the embedded store has no cmsgpack for a multi-job call's packed arguments: no multi-job calls")
	}
	s := New(env.Client, Config{Prefix: env.KeyPrefix(), LockTTL: 10 * time.Second})
	hook := &failScriptsOnce{}
	env.Client.AddHook(hook)
	w := &Writer{s: s, timeout: WriterTimeoutDefault}
	var ops []*Op
	for _, id := range oneShardIDs(t, "ns-multi-", 3) {
		ops = append(ops, &Op{Kind: OpActivate, JobID: id, Node: "a", Create: true,
			Topic: "job.x", Tenant: "t", TraceID: "tr", Request: []byte("req")})
	}
	if u := s.units(ops); len(u) != 1 {
		t.Fatalf("%d units, want 1", len(u))
	}
	for i, r := range execBatch(t, w, ops) {
		if r.Err != nil || r.Status != ActivateCreated {
			t.Errorf("activation %d after NOSCRIPT: %+v", i, r)
		}
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if !hook.fired || hook.sent != 1 {
		t.Errorf("NOSCRIPT answered %v, EVALSHAs sent again %d; want true, 1", hook.fired, hook.sent)
	}
}

// TestMultiCallsAreNotMadeWhereOneJobsFailureSpreads: LoadScripts asks the
// server whether a pcall keeps a failed redis.call to itself; the embedded
// store's does not, and there the Writer sends every op as a call of its
// own, while real Redis groups them.
func TestMultiCallsAreNotMadeWhereOneJobsFailureSpreads(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	s := New(env.Client, Config{Prefix: env.KeyPrefix()})
	if err := s.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := env.RedisEmbedded(); s.single != want {
		t.Fatalf("single %v with embedded Redis %v", s.single, want)
	}
	// Two jobs of one shard: on a Redis Cluster only those share a call.
	a, b := "a", "b"
	for i := 0; Shard(b) != Shard(a); i++ {
		b = fmt.Sprintf("b%d", i)
	}
	ops := []*Op{{Kind: OpTransition, JobID: a}, {Kind: OpTransition, JobID: b}}
	want := 1
	if s.single {
		want = 2
	}
	if u := s.units(ops); len(u) != want {
		t.Fatalf("two transitions make %d units, want %d", len(u), want)
	}
}

// TestRefilledOpsReadEachCallsOwnReply: an op refilled for its next write
// (Op.Refill, as a job actor refills its one op) keeps the command that
// holds its part of a multi-job call's reply, made once, and its outcome is
// its own storage; each call's outcome is that call's: a job whose last
// call failed reads the next one's success, and one whose last call applied
// reads the next one's error.
func TestRefilledOpsReadEachCallsOwnReply(t *testing.T) {
	t.Parallel()
	env, s, w := multiCallWriter(t)
	ctx := context.Background()
	const n = 4
	ids := oneShardIDs(t, "refill-", n)
	ops := make([]*Op, n)
	for i := range ids {
		ops[i] = &Op{}
		ops[i].Refill(Op{Kind: OpActivate, JobID: ids[i], Node: "a", Create: true, Topic: "job.x",
			Tenant: "t", TraceID: "tr", Request: []byte("req"),
			T: &Transition{Path: []Hop{{To: jobstate.StateScheduled, Reason: "r"}}, Op: "c" + ids[i]}})
	}
	for i, r := range execBatch(t, w, ops) {
		if r.Err != nil || r.Status != ActivateCreated || r != &ops[i].res {
			t.Fatalf("activation of %s: %+v (the op's own outcome: %v)", ids[i], r, r == &ops[i].res)
		}
	}
	split := make([]*redis.Cmd, n)
	for i, op := range ops {
		if split[i] = op.split; split[i] == nil {
			t.Fatalf("op %d has no reply command after a multi-job call", i)
		}
	}
	// Job 3's lock becomes a hash: a transition of it fails.
	if err := env.Client.Del(ctx, s.keys.Lock(ids[3])).Err(); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.HSet(ctx, s.keys.Lock(ids[3]), "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	step := func(op *Op, id string, to jobstate.State) {
		op.Refill(Op{Kind: OpTransition, JobID: id, Node: "a", LockValue: jobstate.LockValue("a", 1),
			T: &Transition{Expect: jobstate.Expect(jobstate.StateScheduled, jobstate.StateDispatched),
				Path: []Hop{{To: to, Reason: "r"}}, Op: "t" + id + string(to)}})
	}
	for i := range ops {
		step(ops[i], ids[i], jobstate.StateDispatched)
	}
	res := execBatch(t, w, ops)
	for i := 0; i < 3; i++ {
		if r := res[i]; r.Err != nil || r.Step != StepOK || r.Before != jobstate.StateScheduled {
			t.Errorf("first transition of %s: %+v, want OK from SCHEDULED", ids[i], r)
		}
	}
	if res[3].Err == nil {
		t.Errorf("transition with a failing command: %+v, want its error", res[3])
	}
	// Op 3 (its last call failed) now moves job 0; op 0 (its last applied)
	// now moves job 3, whose lock is still a hash.
	step(ops[0], ids[3], jobstate.StateRunning)
	step(ops[1], ids[1], jobstate.StateRunning)
	step(ops[2], ids[2], jobstate.StateRunning)
	step(ops[3], ids[0], jobstate.StateRunning)
	res = execBatch(t, w, ops)
	for _, i := range []int{1, 2, 3} {
		if r := res[i]; r.Err != nil || r.Step != StepOK || r.Before != jobstate.StateDispatched {
			t.Errorf("second transition by op %d: %+v, want OK from DISPATCHED", i, r)
		}
	}
	if res[0].Err == nil {
		t.Errorf("op 0's transition of the job with a failing command: %+v, want its error", res[0])
	}
	for i, op := range ops {
		if op.split != split[i] {
			t.Errorf("op %d made a new reply command", i)
		}
	}
}

// TestCreateOfAJobNotNewIsSentAgainWithEveryKey: a create's first send
// names only the keys a new job's create touches (activateCall.newOnly);
// for a job that has a record, a lock or a cancel mark the script changes
// nothing and answers FULL, and the writer sends it again with every key,
// which decides it as before (here: the node's own lock, ADOPTED).
func TestCreateOfAJobNotNewIsSentAgainWithEveryKey(t *testing.T) {
	t.Parallel()
	env, s := loadedStore(t)
	w := s.NewWriter(1, 64, 1024)
	t.Cleanup(w.Close)
	ctx := context.Background()
	create := func() *Op {
		return &Op{Kind: OpActivate, JobID: "again-1", Node: "a", Create: true, Topic: "job.x", Tenant: "t",
			Request: []byte("req"), T: &Transition{Path: []Hop{{To: jobstate.StateDispatched, Reason: "d"}},
				Due: time.Now().Add(time.Hour).UnixMilli(), Op: "c1"}}
	}
	if r := execBatch(t, w, []*Op{create()}); r[0].Err != nil || r[0].Status != ActivateCreated {
		t.Fatalf("create: %+v", r[0])
	}
	before, err := env.Client.HGetAll(ctx, s.keys.Job("again-1")).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The new-job-only call, alone: FULL, nothing changed.
	op := create()
	call := s.hotCall(op, time.Now().UnixMilli(), nil).(*activateCall)
	if !call.newOnly || call.keyCount() != 5 {
		t.Fatalf("a create's first call: newOnly %v, %d keys", call.newOnly, call.keyCount())
	}
	v, err := evalSha(ctx, env.Client, call).StringSlice()
	if err != nil || len(v) < 1 || v[0] != activateFull {
		t.Fatalf("new-job-only call of a job that exists: %q, %v", v, err)
	}
	after, _ := env.Client.HGetAll(ctx, s.keys.Job("again-1")).Result()
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the FULL call changed the record:\n%v\n%v", before, after)
	}
	// Through the writer: sent again with every key, and decided.
	r := execBatch(t, w, []*Op{create()})
	if r[0].Err != nil || r[0].Status != ActivateAdopted || r[0].Fence != 2 {
		t.Fatalf("the create sent again: %+v", r[0])
	}
}
