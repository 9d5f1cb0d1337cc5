package store

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/testenv"
)

// TestDispatchLandingIsStampedOnRedisClock: a record field a write gives
// the value jobstate.LandedNow is set, by the write's script, to when the
// write landed on Redis's clock (TIME, unix ms) — a create with a plan, a
// transition, and both as multi-job calls; other fields are written as
// given (an adopter compares the landing with the slot asks the dispatch
// recorded: lifecycle's adoptedSlotStale).
func TestDispatchLandingIsStampedOnRedisClock(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	s := New(env.Client, Config{Prefix: env.KeyPrefix(), LockTTL: 10 * time.Second})
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	w := &Writer{s: s, timeout: WriterTimeoutDefault}
	redisMs := func() int64 {
		now, err := env.Client.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return now.UnixMilli()
	}
	fields := []string{"worker", "w1", "tsat", "1700000000000", jobstate.FieldLanded, jobstate.LandedNow, "subj", "cap.w1"}
	dispatch := &Transition{Path: []Hop{{To: jobstate.StateScheduled, Reason: "allowed"},
		{To: jobstate.StateDispatched, Reason: "dispatched"}}, Due: time.Now().Add(time.Minute).UnixMilli(), Fields: fields}
	back := func(id string) *Op {
		return &Op{Kind: OpTransition, JobID: id, Node: "a", LockValue: jobstate.LockValue("a", 1),
			T: &Transition{Expect: jobstate.Expect(jobstate.StateDispatched),
				Path: []Hop{{To: jobstate.StateScheduled, Reason: "tenant_limit"}}, Due: -1}}
	}
	again := func(id string) *Op {
		return &Op{Kind: OpTransition, JobID: id, Node: "a", LockValue: jobstate.LockValue("a", 1),
			T: &Transition{Expect: jobstate.Expect(jobstate.StateScheduled),
				Path: []Hop{{To: jobstate.StateDispatched, Reason: "dispatched"}}, Due: -1, Fields: fields}}
	}
	check := func(what, id string, from, to int64) {
		t.Helper()
		f, err := env.Client.HGetAll(ctx, s.keys.Job(id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		landed, err := strconv.ParseInt(f[jobstate.FieldLanded], 10, 64)
		if err != nil || landed < from || landed > to {
			t.Errorf("%s of %s: %s = %q, want Redis's TIME within [%d, %d]", what, id, jobstate.FieldLanded,
				f[jobstate.FieldLanded], from, to)
		}
		if f["tsat"] != "1700000000000" || f["worker"] != "w1" || f["subj"] != "cap.w1" {
			t.Errorf("%s of %s: fields %v not written as given", what, id, f)
		}
	}
	create := func(id string) *Op {
		return &Op{Kind: OpActivate, JobID: id, Node: "a", Create: true, Topic: "job.x", Tenant: "t", TraceID: "tr",
			Request: []byte("req"), T: dispatch}
	}

	// One job at a time.
	from := redisMs()
	if r := execBatch(t, w, []*Op{create("landed-1")})[0]; r.Err != nil || r.Status != ActivateCreated {
		t.Fatalf("create: %+v", r)
	}
	check("the create", "landed-1", from, redisMs())
	if r := execBatch(t, w, []*Op{back("landed-1")})[0]; r.Err != nil || r.Step != StepOK {
		t.Fatalf("back to SCHEDULED: %+v", r)
	}
	time.Sleep(5 * time.Millisecond) // a later landing is a later TIME
	from = redisMs()
	if r := execBatch(t, w, []*Op{again("landed-1")})[0]; r.Err != nil || r.Step != StepOK {
		t.Fatalf("dispatch again: %+v", r)
	}
	check("the transition", "landed-1", from, redisMs())

	// Multi-job calls, where the server runs them.
	if s.single {
		return
	}
	ids := oneShardIDs(t, "landed-m", 3)
	var ops []*Op
	for _, id := range ids {
		ops = append(ops, create(id))
	}
	from = redisMs()
	for i, r := range execBatch(t, w, ops) {
		if r.Err != nil || r.Status != ActivateCreated {
			t.Fatalf("create of %s: %+v", ids[i], r)
		}
	}
	to := redisMs()
	for _, id := range ids {
		check("a multi-job create", id, from, to)
	}
	ops = ops[:0]
	for _, id := range ids {
		ops = append(ops, back(id))
	}
	execBatch(t, w, ops)
	ops = ops[:0]
	for _, id := range ids {
		ops = append(ops, again(id))
	}
	from = redisMs()
	for i, r := range execBatch(t, w, ops) {
		if r.Err != nil || r.Step != StepOK {
			t.Fatalf("transition of %s: %+v", ids[i], r)
		}
	}
	to = redisMs()
	for _, id := range ids {
		check("a multi-job transition", id, from, to)
	}
}
