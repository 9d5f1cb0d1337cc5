package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// The hot-path calls write their KEYS and ARGV into the EVALSHA's
// arguments themselves (argsAppender), mostly as pointers. What goes on the
// wire must be, value for value, the order lua/activate.lua and
// lua/transition.lua document — or a script would read the wrong argument —
// and keyCount and argCount must fit what is appended.
func TestAppendedScriptArgsFollowTheScriptsOrder(t *testing.T) {
	plan := &Transition{Expect: jobstate.Expect(jobstate.StateDispatched, jobstate.StateRunning),
		Path:   []Hop{{To: jobstate.StateScheduled, Reason: "r1"}, {To: jobstate.StateDispatched, Reason: "r2"}},
		Fields: []string{"worker", "w1"}, Op: "op1",
		Adds: []ShardZAdd{{Suffix: "saga:stack:wf", Score: 1, Member: "m", TrimBelow: 3, TTL: time.Hour}},
		Sets: []ShardHSet{{Suffix: "saga:tmpl:wf", Field: "f", Value: "v", TTL: time.Hour}}}
	withPlan := planArgs{t: plan, tag: "x{1}:", extra: &ShardZAdd{Suffix: dlqOutboxSuffix, Score: 9, Member: "entry"}}
	// The plan's part: write keys; n, hops, m, adds, h, sets, fields, op.
	planKeys := []string{"x{1}:saga:stack:wf", "x{1}:" + dlqOutboxSuffix, "x{1}:saga:tmpl:wf"}
	planArgv := []string{"2", "SCHEDULED", "r1", "DISPATCHED", "r2",
		"2", "1", "m", "3", "3600000", "9", "entry", "0", "0",
		"1", "f", "v", "3600000", "worker", "w1", "op", "op1"}
	cases := []struct {
		name string
		call interface {
			scriptCall
			argsAppender
		}
		keys, argv []string
	}{
		{"activate, no plan", &activateCall{jobKey: "j", lockKey: "l", dueKey: "d", leasesKey: "le", indexKey: "i",
			ownerAliveKey: "a", ownerParkedKey: "p", markKey: "m", cancelledKey: "c", node: "n", nowMs: 12, lockTTLMs: 34, create: true, jobID: "id",
			topic: "t", tenant: "te", traceID: "tr", request: []byte("req"), rescueAtMs: 56, lockAfter: "keep",
			dueMs: 78, parkedOwner: "po"},
			[]string{"j", "l", "d", "i", "m", "le", "a", "p", "c"},
			[]string{"n", "12", "34", "1", "id", "req", "keep", "78", "po", "80", "0", "0", "0",
				"pd", "topic:1:ttenant:2:tetrace:2:tr"}},
		{"activate, plan", &activateCall{jobKey: "j", lockKey: "l", dueKey: "d", leasesKey: "le", indexKey: "i",
			ownerAliveKey: "a", ownerParkedKey: "p", markKey: "m", cancelledKey: "c", node: "n", jobID: "id", lockAfter: "keep", parkedOwner: "po",
			rescueAtMs: 56, plan: withPlan}, // due 0: the rescue time is sent
			append([]string{"j", "l", "d", "i", "m", "le", "a", "p", "c"}, planKeys...),
			append([]string{"n", "0", "0", "0", "id", "", "keep", "56", "po", "0"}, planArgv...)},
		{"transition, plan", &transitionCall{jobKey: "j", lockKey: "l", dueKey: "d",
			toIndexKey: "ti", fromIndexKeys: []string{"f1", "f2"}, lockValue: "n|1", node: "n", expected: "A,B",
			nowMs: 12, jobID: "id", lockAfter: "terminal", dueMs: -1, plan: withPlan},
			append([]string{"j", "l", "d", "ti", "f1", "f2"}, planKeys...),
			append([]string{"n|1", "n", "A,B", "12", "id", "terminal", "-1", "0"}, planArgv...)},
	}
	for _, c := range cases {
		appended := c.call.appendKeys(nil)
		if got := keyStrings(appended); fmt.Sprint(got) != fmt.Sprint(c.keys) {
			t.Errorf("%s: keys %q, want %q", c.name, got, c.keys)
		}
		var argv []string
		for _, a := range c.call.appendArgs(nil) {
			argv = append(argv, argString(a))
		}
		if fmt.Sprint(argv) != fmt.Sprint(c.argv) {
			t.Errorf("%s: argv\n%q\nwant\n%q", c.name, argv, c.argv)
		}
		if c.call.keyCount() != len(appended) || c.call.keyCount() != len(c.call.keys()) {
			t.Errorf("%s: keyCount %d, %d appended", c.name, c.call.keyCount(), len(appended))
		}
		if c.call.argCount() < len(appended)+len(argv) {
			t.Errorf("%s: argCount %d < %d appended", c.name, c.call.argCount(), len(appended)+len(argv))
		}
	}
}

// argString is how go-redis writes a to the wire: pointers as their values.
func argString(a interface{}) string {
	switch v := a.(type) {
	case *string:
		return *v
	case *int64:
		return fmt.Sprint(*v)
	case []byte:
		return string(v)
	default:
		return fmt.Sprint(v)
	}
}

// A recycled argument list comes back empty and cleared (it holds no
// pointer into an old call), lists too small or too big are not kept, and
// no more than argListsKept idle lists are.
func TestArgListsAreClearedAndBounded(t *testing.T) {
	var f argFreeList
	l := f.get(10)
	if len(l) != 0 || cap(l) < argListCap {
		t.Fatalf("new list: len %d cap %d", len(l), cap(l))
	}
	s := "key"
	l = append(l, "evalsha", &s, 7)
	f.put(l)
	again := f.get(10)
	if len(again) != 0 || &again[:1][0] != &l[:1][0] {
		t.Fatal("the list put back was not the one handed out again")
	}
	for i, v := range again[:cap(again)] {
		if v != nil {
			t.Fatalf("recycled list holds %v at %d", v, i)
		}
	}
	if big := f.get(argListCap + 1); cap(big) < argListCap+1 {
		t.Fatalf("a list for %d arguments has room for %d", argListCap+1, cap(big))
	}
	f.put(make([]interface{}, 0, 8))
	f.put(make([]interface{}, 0, argListMaxCap+1))
	if len(f.free) != 0 {
		t.Fatalf("%d lists kept of sizes that should not be", len(f.free))
	}
	for i := 0; i < argListsKept+10; i++ {
		f.put(make([]interface{}, 0, argListCap))
	}
	if len(f.free) != argListsKept {
		t.Fatalf("%d idle lists kept, bound %d", len(f.free), argListsKept)
	}
}
