package saga

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
)

type bundle struct {
	env *testenv.Env
	st  *store.Store
	rt  *runtime
}

func setup(t *testing.T) *bundle {
	t.Helper()
	env := testenv.New(t)
	st := store.New(env.Redis, store.Config{Prefix: env.KeyPrefix()})
	cfg := Config{Store: st, NodeID: "n1", Log: slog.New(slog.DiscardHandler)}
	cfg.applyDefaults()
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{env: env, st: st, rt: &runtime{cfg: cfg, m: m}}
}

// recordStep writes what a succeeded step's terminal write leaves behind:
// the template in its workflow's templates hash and the step on its shard's
// stack (legacy: the template on the step's record, as nodes of earlier
// versions wrote it).
func (b *bundle) recordStep(t *testing.T, wf, jobID string, index int32, completedMs int64, raw []byte, legacy ...bool) {
	t.Helper()
	ctx := context.Background()
	keys := b.st.Keys()
	if raw == nil {
		var err error
		raw, err = proto.Marshal(&capv1.JobRequest{JobId: jobID, Topic: "job.undo", WorkflowId: wf, StepIndex: index})
		if err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if len(legacy) > 0 && legacy[0] {
		err = b.env.Redis.HSet(ctx, keys.Job(jobID), TemplateField, raw, "topic", "job.do").Err()
	} else {
		err = b.env.Redis.HSet(ctx, TemplatesKey(keys, store.Shard(jobID), wf),
			StepTemplateField(jobID), raw, stepTopicField(jobID), "job.do").Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	stack := keys.Tag(jobID) + StackPrefix + wf
	if err := b.env.Redis.ZAdd(ctx, stack, redis.Z{Score: float64(completedMs), Member: jobID}).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestLoadStackIsNewestFirstOverEveryShard(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Enough steps to land on several shards; s3 and s4 completed in the
	// same millisecond, so their step index orders them.
	b.recordStep(t, "wf", "s1", 1, 1000, nil)
	b.recordStep(t, "wf", "s2", 2, 2000, nil)
	b.recordStep(t, "wf", "s3", 3, 3000, nil, true) // recorded by an earlier version
	b.recordStep(t, "wf", "s4", 4, 3000, nil)
	b.recordStep(t, "wf", "bad", 5, 500, []byte{0xff, 0xff})
	b.recordStep(t, "other", "x1", 1, 9000, nil)
	steps, err := LoadStack(context.Background(), b.st, "wf")
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, s := range steps {
		order = append(order, s.JobID)
	}
	if want := []string{"s4", "s3", "s2", "s1", "bad"}; !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	if steps[0].Template.GetStepIndex() != 4 || steps[0].Topic != "job.do" || steps[0].DecodeErr != nil {
		t.Fatalf("step %+v", steps[0])
	}
	if steps[1].Template.GetStepIndex() != 3 || steps[1].Topic != "job.do" || steps[1].DecodeErr != nil {
		t.Fatalf("legacy step %+v", steps[1])
	}
	if bad := steps[4]; bad.DecodeErr == nil || bad.Template != nil || bad.Index != -1 || len(bad.Raw) != 2 {
		t.Fatalf("corrupt step %+v", bad)
	}
}

func TestWorkflowLockHasOneHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, rdb, key := context.Background(), b.env.Redis, LockKey(b.st.Keys(), "wf")
	a, c := lockToken("n1"), lockToken("n1")
	if ok, err := takeLock(ctx, rdb, key, a, time.Minute); err != nil || !ok {
		t.Fatalf("first take: %v %v", ok, err)
	}
	if ok, _ := takeLock(ctx, rdb, key, c, time.Minute); ok {
		t.Fatal("a second holder took a held lock")
	}
	if ok, _ := renewLock(ctx, rdb, key, c, time.Minute); ok {
		t.Fatal("a non-holder renewed the lock")
	}
	releaseLock(rdb, key, c) // not the holder: no effect
	if ok, _ := takeLock(ctx, rdb, key, a, time.Minute); !ok {
		t.Fatal("the holder lost its lock to a non-holder's release")
	}
	releaseLock(rdb, key, a)
	if ok, _ := takeLock(ctx, rdb, key, c, time.Minute); !ok {
		t.Fatal("a released lock could not be taken")
	}
}

func TestDropTriggersKeepsTriggersNewerThanTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, keys := context.Background(), b.st.Keys()
	old, newer, other := TriggersKey(keys, 3), TriggersKey(keys, 40), TriggersKey(keys, 41)
	b.env.Redis.ZAdd(ctx, old, redis.Z{Score: 100, Member: "wf"})
	b.env.Redis.ZAdd(ctx, newer, redis.Z{Score: 300, Member: "wf"})
	b.env.Redis.ZAdd(ctx, other, redis.Z{Score: 100, Member: "wf-other"})
	r := &rollback{rt: b.rt, wf: "wf", upToMs: 200, log: b.rt.cfg.Log}
	if err := r.dropTriggers(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.env.Redis.ZScore(ctx, old, "wf").Err(); err != redis.Nil {
		t.Fatalf("trigger the run covered is still set (%v)", err)
	}
	if err := b.env.Redis.ZScore(ctx, newer, "wf").Err(); err != nil {
		t.Fatalf("a trigger newer than the run was dropped: %v", err)
	}
	if err := b.env.Redis.ZScore(ctx, other, "wf-other").Err(); err != nil {
		t.Fatalf("another workflow's trigger was dropped: %v", err)
	}
}

func TestPollerDeliversEachWorkflowOnceFromOneReplica(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, keys := context.Background(), b.st.Keys()
	b.env.Redis.ZAdd(ctx, TriggersKey(keys, 1), redis.Z{Score: 5, Member: "wf1"})
	b.env.Redis.ZAdd(ctx, TriggersKey(keys, 2), redis.Z{Score: 9, Member: "wf1"})
	b.env.Redis.ZAdd(ctx, TriggersKey(keys, 63), redis.Z{Score: 7, Member: "wf2"})
	got := map[string][]int64{}
	p1 := newPoller(b.rt, func(wf string, upTo int64) { got[wf] = append(got[wf], upTo) })
	p2 := newPoller(b.rt, func(wf string, upTo int64) { t.Errorf("second poller delivered %s", wf) })
	if n := p1.tick(); n != 2 {
		t.Fatalf("delivered %d workflows, want 2", n)
	}
	if len(got["wf1"]) != 1 || got["wf1"][0] != 9 || len(got["wf2"]) != 1 || got["wf2"][0] != 7 {
		t.Fatalf("deliveries %v", got)
	}
	if n := p2.tick(); n != 0 {
		t.Fatalf("a second replica polled while the first holds the lock (%d)", n)
	}
}

func TestCompensationJobIDIsAFunctionOfWorkflowAndStep(t *testing.T) {
	t.Parallel()
	a := CompensationJobID("wf", "s1")
	if a != CompensationJobID("wf", "s1") || a == CompensationJobID("wf", "s2") || a == CompensationJobID("wf2", "s1") {
		t.Fatal("compensation ids are not deterministic and distinct")
	}
	if len(a) != len("comp-")+32 {
		t.Fatalf("id %q", a)
	}
}

func TestStatusOfSteps(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		outcomes []StepOutcome
		want     Status
	}{
		{nil, StatusCompleted},
		{[]StepOutcome{OutcomeSucceeded, OutcomeSucceeded}, StatusCompleted},
		{[]StepOutcome{OutcomeSucceeded, OutcomeDenied}, StatusCompletedWithSkips},
		{[]StepOutcome{OutcomeUnmarshalFailed, OutcomeTimedOut}, StatusFailed},
		{[]StepOutcome{OutcomeFailed, OutcomeDenied}, StatusFailed},
	} {
		steps := map[string]StepProgress{}
		for i, o := range tc.outcomes {
			steps[string(rune('a'+i))] = StepProgress{Outcome: o}
		}
		if got := statusOf(steps); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.outcomes, got, tc.want)
		}
	}
}
