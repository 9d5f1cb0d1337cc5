package store

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
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
func activateBefore(t *testing.T) *redis.Script {
	t.Helper()
	var b strings.Builder
	for _, f := range []string{"shard_writes", "hops", "activate"} {
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
func argsBefore(c *activateCall) []interface{} {
	args := c.appendArgs(nil)
	if args[3] == "2" {
		args[3] = "1"
	}
	return args
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
	mk := func(prefix string) *Store {
		s := New(env.Client, Config{Prefix: env.KeyPrefix() + prefix, LockTTL: 10 * time.Second})
		if err := s.LoadScripts(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}
	older, newer, multi := mk("o:"), mk("n:"), mk("m:")
	stores := []*Store{older, newer, multi}
	if newer.single {
		stores = stores[:2] // no multi-job calls on this server
	}
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
		call := s.hotCall(op, now, nil).(*activateCall)
		call.rescueAtMs = now + 300_000
		var v []string
		var err error
		switch s {
		case older:
			v, err = before.Eval(ctx, env.Client, keyStrings(call.appendKeys(nil)), argsBefore(call)...).StringSlice()
		case newer:
			v, err = evalScript(ctx, env.Client, call).StringSlice()
		default:
			splitMulti(ctx, []*Op{op}, evalShaMulti(ctx, env.Client, activateMultiScript, []packer{call}))
			v, err = replyStrings(nil, op.cmds[0].(*redis.Cmd))
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
	// Every key either wrote, the record's fields in Redis's order.
	state := func(s *Store) map[string]string {
		out := map[string]string{}
		iter := env.Client.Scan(ctx, 0, s.keys.Prefix()+"*", 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
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
		if err := iter.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	o := state(older)
	if len(o) < 2*len(cases) {
		t.Fatalf("only %d keys written: %v", len(o), o)
	}
	for _, s := range stores[1:] {
		n := state(s)
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
				t.Errorf("key %s only by this version: %s", k, v)
			}
		}
	}
	listpack := 0
	for k, v := range o {
		if strings.Contains(k, ":job:") && strings.HasPrefix(v, "listpack ") {
			listpack++
		}
	}
	if listpack < len(cases)-2 {
		t.Errorf("%d records in the listpack encoding: their fields' order is not compared", listpack)
	}
}
