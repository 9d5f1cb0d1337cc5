package store

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/testenv"
)

// The tests here check the multi-job calls' shared-key writes made once a
// call (lua/lib/later_multi.lua): that a call writes what its jobs' calls
// of their own would, and that a write that fails when the call's writes
// are made is still its job's failure only.

// TestMultiCallKeepsAFailingIndexWriteToItsJob makes one job's index key a
// string, so that the write of that job to it fails, and sends that job's
// transition in one flush with others of other keys: the damaged job gets
// an error; every other job applies, its record, index entries, due entry
// and lock what its transition makes of them.
func TestMultiCallKeepsAFailingIndexWriteToItsJob(t *testing.T) {
	t.Parallel()
	env, s, w := multiCallWriter(t)
	ctx := context.Background()
	// The others share one shard (so that they share keys, and a call on a
	// cluster too); the damaged job is of another shard, alone in it.
	ids := oneShardIDs(t, "fail-", 5)
	bad := "bad-0"
	for i := 1; Shard(bad) == Shard(ids[0]); i++ {
		bad = "bad-" + strconv.Itoa(i)
	}
	ids = append(ids[:2], append([]string{bad}, ids[2:]...)...) // the damaged job in the middle
	due := time.Now().Add(time.Hour).UnixMilli()
	var acts []*Op
	for _, id := range ids {
		acts = append(acts, &Op{Kind: OpActivate, JobID: id, Node: "a", Create: true, Topic: "job.x",
			Tenant: "t", TraceID: "tr", Request: []byte("req"),
			T: &Transition{Path: []Hop{{To: jobstate.StateScheduled, Reason: "r"}, {To: jobstate.StateDispatched, Reason: "d"}},
				Due: due}})
	}
	for i, r := range execBatch(t, w, acts) {
		if r.Err != nil || r.Status != ActivateCreated || r.State != jobstate.StateDispatched {
			t.Fatalf("activation of %s: %+v", ids[i], r)
		}
	}
	// The damaged job's shard's index of SUCCEEDED is a string.
	badIdx := s.keys.Index(Shard(bad), string(jobstate.StateSucceeded))
	if err := env.Client.Set(ctx, badIdx, "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var steps []*Op
	for _, id := range ids {
		steps = append(steps, &Op{Kind: OpTransition, JobID: id, Node: "a", LockValue: jobstate.LockValue("a", 1),
			T: &Transition{Expect: jobstate.Expect(jobstate.StateDispatched), Op: "t" + id,
				Path: []Hop{{To: jobstate.StateRunning, Reason: "s"}, {To: jobstate.StateSucceeded, Reason: "c"}}}})
	}
	if u := s.units(steps); !s.cluster && len(u) != 1 {
		t.Fatalf("the transitions make %d units, want one", len(u))
	}
	res := execBatch(t, w, steps)
	for i, id := range ids {
		if id == bad {
			if res[i].Err == nil {
				t.Errorf("the damaged job's transition: %+v, want its error", res[i])
			}
			continue
		}
		if r := res[i]; r.Err != nil || r.Step != StepOK || r.Before != jobstate.StateDispatched {
			t.Errorf("transition of %s: %+v, want OK from DISPATCHED", id, r)
		}
		sh := Shard(id)
		if st := env.Client.HGet(ctx, s.keys.Job(id), "s").Val(); st != string(jobstate.StateSucceeded) {
			t.Errorf("%s is %q, want SUCCEEDED", id, st)
		}
		if err := env.Client.ZScore(ctx, s.keys.Index(sh, string(jobstate.StateSucceeded)), id).Err(); err != nil {
			t.Errorf("%s in the index of SUCCEEDED: %v", id, err)
		}
		if err := env.Client.ZScore(ctx, s.keys.Index(sh, string(jobstate.StateDispatched)), id).Err(); err != redis.Nil {
			t.Errorf("%s still in the index of DISPATCHED (%v)", id, err)
		}
		for _, m := range []string{id, "|" + id} {
			if err := env.Client.ZScore(ctx, s.keys.Due(sh), m).Err(); err != redis.Nil {
				t.Errorf("%s: due member %q still there (%v)", id, m, err)
			}
		}
		if n := env.Client.Exists(ctx, s.keys.Lock(id)).Val(); n != 0 {
			t.Errorf("%s: the lock is still there", id)
		}
	}
	if v := env.Client.Get(ctx, badIdx).Val(); v != "not a sorted set" {
		t.Errorf("the damaged index key holds %q", v)
	}
}

// TestMultiCallWritesWhatSingleCallsWrite sends the same activations, then
// the same transitions, once as one multi-job call each (under one key
// prefix) and once as a call of its own each (the single-job scripts,
// under another), with the same clock, and compares every reply and every
// key the jobs can touch: the multi-job call's writes made once a call
// leave the keys what the calls of their own leave them. The ops cover
// the creates (with a due time, with the rescue time, terminal), a job
// twice in one call (created, then adopted; two transitions), a missing
// job, stale fences and terminal, kept and released locks.
func TestMultiCallWritesWhatSingleCallsWrite(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	mk := func(prefix string) *Store {
		s := New(env.Client, Config{Prefix: env.KeyPrefix() + prefix, LockTTL: 10 * time.Second})
		if err := s.LoadScripts(ctx); err != nil {
			t.Fatal(err)
		}
		if s.single {
			t.Skip("the server's Lua does not keep one job's failure to it: no multi-job calls")
		}
		return s
	}
	multi, single := mk("m:"), mk("s:")
	ids := oneShardIDs(t, "eq-", 7)
	now := time.Now().UnixMilli()
	due, rescue := now+60_000, now+300_000
	hops := func(to ...jobstate.State) []Hop {
		var h []Hop
		for _, st := range to {
			h = append(h, Hop{To: st, Reason: "r-" + jobstate.Reason(st)})
		}
		return h
	}
	create := func(id string, t *Transition) *Op {
		return &Op{Kind: OpActivate, JobID: id, Node: "n", Create: true, Topic: "job.x", Tenant: "t", TraceID: "tr-" + id,
			Request: []byte("req-" + id), T: t}
	}
	step := func(id string, lock string, t *Transition) *Op {
		return &Op{Kind: OpTransition, JobID: id, Node: "n", LockValue: lock, T: t}
	}
	S, D, R := jobstate.StateScheduled, jobstate.StateDispatched, jobstate.StateRunning
	calls := [][]func() *Op{{
		func() *Op {
			return create(ids[0], &Transition{Path: hops(S, D), Due: due, Fields: []string{"worker", "w1"}, Op: "o0"})
		},
		func() *Op { return create(ids[1], &Transition{Path: hops(S), Op: "o1"}) },
		func() *Op { return create(ids[2], &Transition{Path: hops(S, jobstate.StateFailed), Op: "o2"}) },
		func() *Op { return create(ids[0], &Transition{Path: hops(S, D), Due: due, Op: "o0b"}) }, // adopts it
		func() *Op { return create(ids[3], &Transition{Path: hops(S, D), Due: due + 1, Op: "o3"}) },
		func() *Op { return &Op{Kind: OpActivate, JobID: ids[4], Node: "n"} }, // no job
		func() *Op { return create(ids[5], &Transition{Path: hops(S), Due: due + 2, Release: true, Op: "o5"}) },
		func() *Op { return create(ids[6], &Transition{Path: hops(S, D), Due: due + 3, Op: "o6"}) },
	}, {
		func() *Op {
			return step(ids[3], "n|1", &Transition{Expect: jobstate.Expect(D), Path: hops(R, jobstate.StateSucceeded), Op: "p3"})
		},
		func() *Op {
			return step(ids[0], "n|2", &Transition{Expect: jobstate.Expect(D), Path: hops(R), Op: "p0"})
		},
		func() *Op {
			return step(ids[0], "n|2", &Transition{Expect: jobstate.Expect(R), Path: hops(jobstate.StateSucceeded), Op: "p0b"})
		},
		func() *Op {
			return step(ids[1], "n|1", &Transition{Expect: jobstate.Expect(S), Path: hops(D), Due: due + 4, Op: "p1"})
		},
		func() *Op {
			return step(ids[4], "n|1", &Transition{Expect: jobstate.Expect(S), Path: hops(D), Op: "p4"})
		},
		func() *Op {
			return step(ids[2], "n|1", &Transition{Expect: jobstate.Expect(S), Path: hops(D), Op: "p2"})
		},
		func() *Op {
			return step(ids[6], "n|1", &Transition{Expect: jobstate.Expect(D), Path: hops(R), Due: -1, Release: true, Op: "p6"})
		},
		func() *Op {
			return step(ids[5], "n|1", &Transition{Expect: jobstate.Expect(S, D), Path: hops(D), Op: "p5"}) // released: fenced
		},
	}}
	// replies sends the ops of one call of makes through s, as one
	// multi-job call or as a call of its own each, and returns each op's
	// reply (its strings, or its error).
	replies := func(s *Store, makes []func() *Op, asMulti bool) []string {
		var ops []*Op
		var hot []hotScriptCall
		for _, m := range makes {
			op := m()
			c := s.hotCall(op, now, nil)
			if a, ok := c.(*activateCall); ok {
				a.rescueAtMs = rescue
			}
			ops, hot = append(ops, op), append(hot, c)
		}
		var cmds []*redis.Cmd
		if asMulti {
			calls := make([]packer, len(hot))
			sc := activateMultiScript
			for i, c := range hot {
				calls[i] = c
				if _, ok := c.(*transitionCall); ok {
					sc = transitionMultiScript
				}
			}
			splitMulti(ctx, ops, evalShaMulti(ctx, env.Client, sc, calls))
			for _, op := range ops {
				cmds = append(cmds, op.cmds[0].(*redis.Cmd))
			}
		} else {
			for _, c := range hot {
				cmds = append(cmds, evalSha(ctx, env.Client, c))
			}
		}
		var out []string
		for _, c := range cmds {
			v, err := replyStrings(nil, c)
			out = append(out, fmt.Sprintf("%q %v", v, err))
		}
		return out
	}
	for i, makes := range calls {
		m, s := replies(multi, makes, true), replies(single, makes, false)
		if !reflect.DeepEqual(m, s) {
			t.Errorf("call %d: the multi-job call answers\n%s\nthe calls of their own\n%s", i, m, s)
		}
	}
	// Every key the jobs can touch, under either prefix.
	state := func(s *Store) map[string]string {
		var keys []string
		sh := Shard(ids[0])
		for _, id := range ids {
			keys = append(keys, s.keys.Job(id), s.keys.Lock(id), s.keys.CancelMark(id))
		}
		keys = append(keys, s.keys.Due(sh), s.keys.Leases(sh))
		for _, st := range jobstate.AllStates {
			keys = append(keys, s.keys.Index(sh, string(st)))
		}
		out := map[string]string{}
		for _, k := range keys {
			var v string
			switch typ := env.Client.Type(ctx, k).Val(); typ {
			case "none":
				continue
			case "string":
				v = fmt.Sprintf("%q ttl %v", env.Client.Get(ctx, k).Val(), env.Client.PTTL(ctx, k).Val() > 0)
			case "hash":
				h := env.Client.HGetAll(ctx, k).Val()
				var f []string
				for name, x := range h {
					f = append(f, name+"="+x)
				}
				sort.Strings(f)
				v = fmt.Sprintf("%q", f)
			case "zset":
				v = fmt.Sprint(env.Client.ZRangeWithScores(ctx, k, 0, -1).Val())
			default:
				v = typ
			}
			out[k[len(s.keys.Prefix()):]] = v
		}
		return out
	}
	m, s := state(multi), state(single)
	if len(m) < 10 {
		t.Fatalf("only %d keys written: %v", len(m), m)
	}
	for k, v := range s {
		if m[k] != v {
			t.Errorf("key %s: multi-job call %s, calls of their own %s", k, m[k], v)
		}
	}
	for k, v := range m {
		if _, ok := s[k]; !ok {
			t.Errorf("key %s only after the multi-job call: %s", k, v)
		}
	}
}
