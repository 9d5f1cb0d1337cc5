package store

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/testenv"
)

// activateBefore is activate.lua as of 90a035a (testdata), which took a
// create's hops as (to, reason) pairs and made the record's fields itself:
// nodes of that version run beside this one's (a rolling upgrade, a
// rollback), so what the two write must be the same.
func activateBefore(t *testing.T) *redis.Script { return scriptBefore(t, "activate") }

// transitionBefore is transition.lua as of 90a035a, which made every
// transition's record fields in a table.
func transitionBefore(t *testing.T) *redis.Script { return scriptBefore(t, "transition") }

func scriptBefore(t *testing.T, name string) *redis.Script {
	t.Helper()
	var b strings.Builder
	// lib/shard_writes.lua is unchanged since.
	b.WriteString(luaSource("lib/shard_writes"))
	b.WriteByte('\n')
	for _, f := range []string{"hops", name} {
		src, err := os.ReadFile("testdata/scripts-90a035a/" + f + ".lua")
		if err != nil {
			t.Fatal(err)
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return redis.NewScript(b.String())
}

// argsBefore is the ARGV that 90a035a's activateCall.appendArgs sent: the
// same as now but for create, then "1" whatever the fields' values.
// argsBefore is c's ARGV as 90a035a's activate.lua takes them: a create
// is "1" there, whatever this version sends.
func argsBefore(c *activateCall) []interface{} {
	args := c.appendArgs(nil)
	if args[3] != "0" {
		args[3] = "1"
	}
	return args
}

// keysBefore is c's KEYS in 90a035a's order: every key, the cancel mark
// eighth.
func keysBefore(c *activateCall) []string {
	return append([]string{c.jobKey, c.lockKey, c.dueKey, c.leasesKey, c.indexKey, c.ownerAliveKey, c.ownerParkedKey,
		c.markKey, c.cancelledKey}, c.plan.writeKeys()...)
}

// A create whose record fields activate.lua sends to HSET straight from
// its ARGV, the hops made in the call's arguments, writes byte for byte
// what the version before wrote through a table of them: the record's
// fields in the same order (records short enough for Redis's listpack
// encoding, which keeps the order written), the index, due and lease
// entries, the lock, the shard writes; and answers the same. Cases: a
// plan into DISPATCHED with fields and an op, none (PENDING), a plan that
// ends the job, one released, one with shard writes, a value written as
// the time the write lands, a long node name, more hops than the scripts'
// tables of names hold, a create cancelled by a mark, and a create that
// finds the job and adopts it.
func TestCreatedRecordIsTheVersionBeforesRecord(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	before := activateBefore(t)
	stores := versionStores(t, env)
	older, newer, multi := stores[0], stores[1], stores[len(stores)-1]
	now := time.Now().UnixMilli()
	S, D := jobstate.StateScheduled, jobstate.StateDispatched
	hop := func(to jobstate.State, why string) Hop { return Hop{To: to, Reason: jobstate.Reason(why)} }
	var many []Hop
	for i := 0; i < 14; i++ {
		many = append(many, hop(S, "again"), hop(D, "dispatched"))
	}
	type tc struct {
		name   string
		node   string
		t      *Transition
		mark   bool // a cancel mark for the tenant exists
		exists bool // created once before: this one adopts it
	}
	cases := []tc{
		{name: "dispatched", node: "n1", t: &Transition{Path: []Hop{hop(S, "allowed"), hop(D, "dispatched")},
			Due: now + 60_000, Op: "o1", Fields: []string{"worker", "w1", "subj", "n1.w1", "attempts", "1",
				"deadline", strconv.FormatInt(now+60_000, 10), "sod", "1", "policy_decision", "allow", "rule_id", "r"}}},
		{name: "pending", node: "n1"},
		{name: "ended", node: "n1", t: &Transition{Path: []Hop{hop(S, "allowed"), hop(jobstate.StateDenied, "denied")},
			Op: "o2", Fields: []string{"policy_decision", "deny"}}},
		{name: "released", node: "n1", t: &Transition{Path: []Hop{hop(S, "allowed")}, Release: true, Due: -1, Op: "o3"}},
		{name: "shard writes", node: "n1", t: &Transition{Path: []Hop{hop(S, "allowed")}, Op: "o4",
			Adds: []ShardZAdd{{Suffix: "saga:stack:wf", Score: 5, Member: "m", TTL: time.Hour}},
			Sets: []ShardHSet{{Suffix: "saga:tmpl:wf", Field: "f", Value: "v"}}}},
		{name: "landed", node: "n1", t: &Transition{Path: []Hop{hop(S, "allowed"), hop(D, "dispatched")},
			Fields: []string{"tslot", "1", jobstate.FieldLanded, jobstate.LandedNow, "worker", "w1"}}},
		{name: "long node", node: strings.Repeat("node-", 12), t: &Transition{Path: []Hop{hop(S, "allowed")}}},
		{name: "many hops", node: "n1", t: &Transition{Path: many, Op: "o5"}},
		{name: "cancel mark", node: "n1", mark: true, t: &Transition{Path: []Hop{hop(S, "allowed"), hop(D, "dispatched")},
			Fields: []string{"sub", "123", "worker", "w1"}}},
		{name: "adopted", node: "n2", exists: true, t: &Transition{Path: []Hop{hop(S, "allowed")}, Op: "o6"}},
	}
	run := func(s *Store, c tc, id string) string {
		op := &Op{Kind: OpActivate, JobID: id, Node: c.node, Create: true, Topic: "job.x", Tenant: "te", TraceID: "tr-" + id,
			Request: []byte("req-" + id), T: c.t}
		var v []string
		var err error
		// As the writer sends it: first with a new job's keys only, and
		// again with every key when the job is not new (FULL).
		for send := 0; send < 2; send++ {
			call := s.hotCall(op, now, nil).(*activateCall)
			call.rescueAtMs = now + 300_000
			switch s {
			case older:
				v, err = before.Eval(ctx, env.Client, keysBefore(call), argsBefore(call)...).StringSlice()
			case newer:
				v, err = evalScript(ctx, env.Client, call).StringSlice()
			default:
				splitMulti(ctx, []*Op{op}, evalShaMulti(ctx, env.Client, activateMultiScript, []packer{call}))
				v, err = replyStrings(nil, op.cmds[0].(*redis.Cmd))
			}
			if err != nil || len(v) == 0 || v[0] != activateFull {
				break
			}
			op.full = true
		}
		return fmt.Sprintf("%q %v", v, err)
	}
	for i, c := range cases {
		id := "cr-" + strconv.Itoa(i)
		for _, s := range stores {
			if c.mark {
				if err := env.Client.HSet(ctx, s.keys.CancelMark(id), "te", "op\nno longer wanted").Err(); err != nil {
					t.Fatal(err)
				}
			}
			if c.exists {
				prior := &Op{Kind: OpActivate, JobID: id, Node: "n1", Create: true, Topic: "job.x", Tenant: "te",
					Request: []byte("req"), T: &Transition{Path: []Hop{hop(S, "allowed")}, Release: true}}
				if r := run(s, tc{node: "n1", t: prior.T}, id); !strings.HasPrefix(r, `["CREATED"`) {
					t.Fatalf("%s: the prior create answered %s", c.name, r)
				}
			}
		}
		o, n := run(older, c, id), run(newer, c, id)
		if o != n {
			t.Errorf("%s: the version before answered %s, this one %s", c.name, o, n)
		}
		if len(stores) == 3 {
			if m := run(multi, c, id); m != o {
				t.Errorf("%s: the version before answered %s, this one's multi-job call %s", c.name, o, m)
			}
		}
		want := `["CREATED"`
		switch {
		case c.mark:
			want = `["CANCELLED"`
		case c.exists:
			want = `["ADOPTED"`
		}
		if !strings.HasPrefix(n, want) {
			t.Errorf("%s: answered %s, want %s", c.name, n, want)
		}
	}
	o := sameState(t, env, stores, now, 2*len(cases))
	listpack := 0
	for k, v := range o {
		if strings.Contains(k, ":job:") && strings.HasPrefix(v, "listpack ") {
			listpack++
		}
	}
	// Only a Redis server says what encoding a hash has (OBJECT ENCODING);
	// the embedded store (single) does not.
	if listpack < len(cases)-2 && !stores[1].single {
		t.Errorf("%d records in the listpack encoding: their fields' order is not compared", listpack)
	}
}

// versionStores returns the stores whose writes a test compares: the
// version before's (its script texts run with EVAL), this one's calls of
// their own, and, on a server that takes them, this one's multi-job calls;
// each under a prefix of its own.
func versionStores(t *testing.T, env *testenv.Env) []*Store {
	t.Helper()
	var stores []*Store
	for _, prefix := range []string{"o:", "n:", "m:"} {
		s := New(env.Client, Config{Prefix: env.KeyPrefix() + prefix, LockTTL: 10 * time.Second})
		if err := s.LoadScripts(context.Background()); err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	if stores[0].single {
		stores = stores[:2] // no multi-job calls on this server
	}
	return stores
}

// sameState fails t unless every store holds what the first does
// (storeState), at least min keys; it returns the first's.
func sameState(t *testing.T, env *testenv.Env, stores []*Store, now int64, min int) map[string]string {
	t.Helper()
	o := storeState(t, env, stores[0], now)
	if len(o) < min {
		t.Fatalf("only %d keys written: %v", len(o), o)
	}
	for _, s := range stores[1:] {
		n := storeState(t, env, s, now)
		if reflect.DeepEqual(o, n) {
			continue
		}
		for k, v := range o {
			if n[k] != v {
				t.Errorf("key %s: the version before wrote\n%s\nthis one (%s)\n%s", k, v, s.keys.Prefix(), n[k])
			}
		}
		for k, v := range n {
			if _, ok := o[k]; !ok {
				t.Errorf("key %s only by this version (%s): %s", k, s.keys.Prefix(), v)
			}
		}
	}
	return o
}

// storeState is every key under s's prefix and what it holds, the
// records' fields in Redis's order; a landed time (within a minute of now)
// reads "<landed>".
func storeState(t *testing.T, env *testenv.Env, s *Store, now int64) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	var keys []string
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, s.keys.Prefix()+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		return iter.Err()
	}
	var err error
	switch c := env.Client.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			return scan(ctx, m)
		})
	case *redis.Client:
		err = scan(ctx, c)
	default:
		t.Fatalf("no way to list the keys of a %T", env.Client)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		var v string
		switch typ := env.Client.Type(ctx, k).Val(); typ {
		case "string":
			v = fmt.Sprintf("%q ttl %v", env.Client.Get(ctx, k).Val(), env.Client.PTTL(ctx, k).Val() > 0)
		case "hash":
			// Through a script: a Lua reply is the flat list, in order
			// (a RESP3 client's HGETALL is a map).
			f, err := env.Client.Eval(ctx, "return redis.call('HGETALL', KEYS[1])", []string{k}).StringSlice()
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i+1 < len(f); i += 2 {
				if f[i] == jobstate.FieldLanded {
					// Redis's clock when the write landed: one ms may
					// part the two.
					if ms, err := strconv.ParseInt(f[i+1], 10, 64); err != nil || ms < now-60_000 || ms > now+60_000 {
						t.Errorf("%s: landed %q, not the time it landed", k, f[i+1])
					}
					f[i+1] = "<landed>"
				}
			}
			v = fmt.Sprintf("%s %q", env.Client.ObjectEncoding(ctx, k).Val(), f)
		case "zset":
			v = fmt.Sprint(env.Client.ZRangeWithScores(ctx, k, 0, -1).Val(), " ttl ", env.Client.PTTL(ctx, k).Val() > 0)
		default:
			v = typ
		}
		out[k[len(s.keys.Prefix()):]] = v
	}
	return out
}

// A transition of one or two hops by the node of the job's last hop, which
// transition.lua sends to HSET straight from its ARGV, writes byte for byte
// what the version before wrote through a table: the record's fields in
// Redis's order, the indexes, the due entries, the lock; and answers the
// same. So do the transitions that still go through the table: by another
// node (its name and "hl" written), with a value written as the time the
// write lands, of three hops, past the scripts' tables of hop names, and
// over a record whose "created" is no number.
func TestTransitionRecordIsTheVersionBeforesRecord(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	before := transitionBefore(t)
	stores := versionStores(t, env)
	older, newer := stores[0], stores[1]
	now := time.Now().UnixMilli()
	S, D, R := jobstate.StateScheduled, jobstate.StateDispatched, jobstate.StateRunning
	hop := func(to jobstate.State, why string) Hop { return Hop{To: to, Reason: jobstate.Reason(why)} }
	// step is an op on the job: an activation (a create, or an adoption by
	// another node) or a transition; at, ms after now.
	type step struct {
		node   string
		lock   string // a transition's lock value ("": an activation)
		create bool
		at     int64
		t      *Transition
		set    []string // fields set on the record first, on every store
		expire bool     // the job's lock expires first
	}
	run := func(s *Store, id string, st step) string {
		op := &Op{JobID: id, Node: st.node, T: st.t}
		if st.lock == "" {
			op.Kind, op.Create, op.Topic, op.Tenant, op.Request = OpActivate, st.create, "job.x", "te", []byte("r")
			v, err := evalScript(ctx, env.Client, s.hotCall(op, now+st.at, nil)).StringSlice()
			if err == nil && len(v) > 0 && v[0] == activateFull {
				// Not new: sent again with every key, as the writer does.
				op.full = true
				v, err = evalScript(ctx, env.Client, s.hotCall(op, now+st.at, nil)).StringSlice()
			}
			return fmt.Sprintf("%q %v", v, err)
		}
		op.Kind, op.LockValue = OpTransition, st.lock
		call := s.hotCall(op, now+st.at, nil).(*transitionCall)
		var v []string
		var err error
		switch s {
		case older:
			args := call.appendArgs(nil)
			args = append(args[:7:7], args[8:]...) // no landed argument
			v, err = before.Eval(ctx, env.Client, keyStrings(call.appendKeys(nil)), args...).StringSlice()
		case newer:
			v, err = evalScript(ctx, env.Client, call).StringSlice()
		default:
			splitMulti(ctx, []*Op{op}, evalShaMulti(ctx, env.Client, transitionMultiScript, []packer{call}))
			v, err = replyStrings(nil, op.cmds[0].(*redis.Cmd))
		}
		return fmt.Sprintf("%q %v", v, err)
	}
	create := func(path ...Hop) step {
		return step{node: "n1", create: true, t: &Transition{Path: path, Due: now + 60_000, Op: "c"}}
	}
	tr := func(node, lock string, at int64, from jobstate.State, path ...Hop) step {
		return step{node: node, lock: lock, at: at, t: &Transition{Expect: jobstate.Expect(from), Path: path, Op: "t"}}
	}
	finish := tr("n1", "n1|1", 1234, D, hop(R, "started"), hop(jobstate.StateSucceeded, "completed"))
	finish.t.Fields, finish.t.Release = []string{"result_ptr", "redis://res:x"}, true
	dispatch := tr("n1", "n1|1", 50, S, hop(D, "dispatched"))
	dispatch.t.Fields, dispatch.t.Due = []string{"worker", "w1", "attempts", "1"}, now+90_000
	landed := tr("n1", "n1|1", 60, S, hop(D, "dispatched"))
	landed.t.Fields = []string{"tslot", "1", jobstate.FieldLanded, jobstate.LandedNow}
	many := []step{create(hop(S, "allowed"))}
	for i := 0; i < 7; i++ {
		many = append(many, tr("n1", "n1|1", int64(i), S, hop(D, "dispatched")), tr("n1", "n1|1", int64(i), D, hop(S, "again")))
	}
	weird := tr("n1", "n1|1", 5, S, hop(D, "dispatched"))
	weird.set = []string{"created", "abc"}
	jobs := map[string][]step{
		"finish": {create(hop(S, "allowed"), hop(D, "dispatched")), finish},
		"one hop": {create(hop(S, "allowed")), dispatch, tr("n1", "n1|1", 700, D, hop(R, "started")),
			tr("n1", "n1|1", 900, R, hop(jobstate.StateFailed, "worker_failed"))},
		"adopted": {create(hop(S, "allowed"), hop(D, "dispatched")), {node: "n2", create: true, at: 10, expire: true},
			tr("n2", "n2|2", 20, D, hop(R, "started")), tr("n2", "n2|2", 30, R, hop(S, "retry_wait")),
			tr("n2", "n2|2", -40, S, hop(D, "dispatched"), hop(R, "started"))},
		"landed": {create(hop(S, "allowed")), landed},
		"three":  {create(hop(S, "allowed")), tr("n1", "n1|1", 3, S, hop(D, "d"), hop(R, "r"), hop(jobstate.StateTimeout, "t"))},
		"many":   many,
		"weird":  {create(hop(S, "allowed")), weird},
	}
	for name, steps := range jobs {
		id := "tr-" + strings.ReplaceAll(name, " ", "-")
		for i, st := range steps {
			var replies []string
			for _, s := range stores {
				if len(st.set) > 0 {
					if err := env.Client.HSet(ctx, s.keys.Job(id), st.set).Err(); err != nil {
						t.Fatal(err)
					}
				}
				if st.expire {
					if err := env.Client.Del(ctx, s.keys.Lock(id)).Err(); err != nil {
						t.Fatal(err)
					}
				}
				replies = append(replies, run(s, id, st))
			}
			for j, r := range replies[1:] {
				if r != replies[0] {
					t.Errorf("%s step %d: the version before answered %s, this one (%s) %s", name, i, replies[0], stores[j+1].keys.Prefix(), r)
				}
			}
			if st.lock != "" && !strings.HasPrefix(replies[0], `["OK"`) {
				t.Errorf("%s step %d: answered %s", name, i, replies[0])
			}
		}
	}
	sameState(t, env, stores, now, 2*len(jobs))
}
