package store_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// noScriptErr reads as Redis's reply to an EVALSHA of a script its cache
// does not hold.
type noScriptErr struct{}

func (noScriptErr) Error() string { return "NOSCRIPT No matching script. Please use EVAL." }
func (noScriptErr) RedisError()   {}

// noScriptHook answers NOSCRIPT, without sending them, to the EVALSHAs of
// the next pipeline that has any, once armed; the pipeline's other commands
// run. It counts, by name, the commands that reached Redis.
type noScriptHook struct {
	mu    sync.Mutex
	armed bool
	fired int
	sent  map[string]int
}

func (h *noScriptHook) arm() {
	h.mu.Lock()
	h.armed = true
	h.sent = map[string]int{}
	h.mu.Unlock()
}

func (h *noScriptHook) firedCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fired
}

// count returns how many commands named name reached Redis since arm.
func (h *noScriptHook) count(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sent[name]
}

func (h *noScriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *noScriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		if h.sent != nil {
			h.sent[commandName(cmd)]++
		}
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *noScriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		fire := false
		if h.armed {
			for _, c := range cmds {
				fire = fire || c.Name() == "evalsha"
			}
		}
		var pass []redis.Cmder
		for _, c := range cmds {
			if fire && c.Name() == "evalsha" {
				c.SetErr(noScriptErr{})
				continue
			}
			pass = append(pass, c)
			if h.sent != nil {
				h.sent[commandName(c)]++
			}
		}
		if fire {
			h.armed = false
			h.fired++
		}
		h.mu.Unlock()
		var err error
		if len(pass) > 0 {
			err = next(ctx, pass)
		}
		if fire && err == nil {
			err = noScriptErr{}
		}
		return err
	}
}

// commandName is cmd's name, with the subcommand for SCRIPT ("script load").
func commandName(cmd redis.Cmder) string {
	if cmd.Name() == "script" && len(cmd.Args()) > 1 {
		if sub, ok := cmd.Args()[1].(string); ok {
			return "script " + strings.ToLower(sub)
		}
	}
	return cmd.Name()
}

// TestNoScriptIsLoadedAndSentAgain checks every pipeline of EVALSHAs: when
// Redis answers NOSCRIPT, the scripts are loaded and only the commands that
// met it are sent again, once.
func TestNoScriptIsLoadedAndSentAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	hook := &noScriptHook{}
	b.s.Client().AddHook(hook)

	// The writer.
	hook.arm()
	if r := b.activate(t, "ns1", "a", true); r.Status != store.ActivateCreated {
		t.Fatalf("activation after NOSCRIPT: %+v", r)
	}
	if hook.firedCount() != 1 || hook.count("script load") == 0 || hook.count("evalsha") != 1 {
		t.Fatalf("writer: fired %d, script loads %d, evalsha sent %d; want 1, >0, 1",
			hook.firedCount(), hook.count("script load"), hook.count("evalsha"))
	}
	rec, err := b.s.GetJob(ctx, "ns1")
	if err != nil || len(rec.History) != 1 {
		t.Fatalf("job after a retried creation: %+v %v", rec, err)
	}

	// The lock renewer.
	rn := b.s.NewLockRenewer(nil)
	rn.Hold("ns1", jobstate.LockValue("a", 1), func(bool) { t.Error("lock ns1 lost") })
	hook.arm()
	rn.RenewOnce(ctx)
	if st := rn.Stats(); st.Renewed != 1 || hook.count("evalsha") != 1 {
		t.Fatalf("renewer after NOSCRIPT: %+v, evalsha sent %d", st, hook.count("evalsha"))
	}

	// The due poller's pops, over every shard.
	due := time.Now().Add(-time.Second)
	r := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "ns1", Node: "a", LockValue: jobstate.LockValue("a", 1),
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StatePending), Due: due.UnixMilli(),
			Path: []store.Hop{{To: jobstate.StateScheduled, Reason: "r"}}}})
	if !r.OK() {
		t.Fatalf("transition: %+v", r)
	}
	hook.arm()
	ids, err := b.s.DueJobs(ctx, time.Now(), time.Now().Add(time.Minute), 10)
	if err != nil || len(ids) != 1 || ids[0] != "ns1" || hook.count("evalsha") != store.Shards {
		t.Fatalf("due jobs after NOSCRIPT: %v %v, evalsha sent %d", ids, err, hook.count("evalsha"))
	}

	// The retention trim: one script per terminal-state index with ids to
	// drop (here one, an entry of a job long ended).
	if err := b.s.Client().ZAdd(ctx, b.s.Keys().Index(store.Shard("ns-old"), string(jobstate.StateSucceeded)),
		redis.Z{Score: 1, Member: "ns-old"}).Err(); err != nil {
		t.Fatal(err)
	}
	hook.arm()
	if n, err := b.s.TrimTerminal(ctx, time.Now()); err != nil || n != 1 || hook.count("evalsha") != 1 {
		t.Fatalf("trim after NOSCRIPT: %d, %v, evalsha sent %d", n, err, hook.count("evalsha"))
	}

	// A dead node's adoption: the parked sets' rescoring went through in
	// the first pipeline and is not sent again.
	if err := b.s.Client().ZAdd(ctx, b.s.Keys().Nodes(), redis.Z{Score: 5, Member: "dead"}).Err(); err != nil {
		t.Fatal(err)
	}
	hook.arm()
	ok, err := b.s.StartAdoption(ctx, "dead", time.Now())
	if err != nil || !ok || hook.count("evalsha") != 1 || hook.count("zunionstore") != store.Shards {
		t.Fatalf("adoption after NOSCRIPT: %v %v, evalsha sent %d, zunionstore sent %d",
			ok, err, hook.count("evalsha"), hook.count("zunionstore"))
	}
}
