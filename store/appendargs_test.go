package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/troupe-run/troupe/core"
)

// The hot-path calls write their KEYS and ARGV into the EVALSHA's
// arguments themselves (argsAppender), mostly as pointers. What they write
// must be, value for value, what keys() and args() say — the order each
// script's file documents — or a script would read the wrong argument.
func TestAppendedScriptArgsMatchKeysAndArgs(t *testing.T) {
	plan := &Transition{Expect: Expect(core.StateDispatched, core.StateRunning),
		Path:   []Hop{{To: core.StateScheduled, Reason: "r1"}, {To: core.StateDispatched, Reason: "r2"}},
		Fields: []string{"worker", "w1", "subj", "s1"}, Op: "op1",
		Adds: []ShardZAdd{{Suffix: "saga:stack:wf", Score: 1, Member: "m", TrimBelow: 3, TTL: time.Hour}},
		Sets: []ShardHSet{{Suffix: "saga:tmpl:wf", Field: "f", Value: "v", TTL: time.Hour}}}
	extra := &ShardZAdd{Suffix: dlqOutboxSuffix, Score: 9, Member: "entry"}
	for _, p := range []planArgs{{}, {t: plan, tag: "x{1}:"}, {t: plan, tag: "x{1}:", extra: extra}} {
		calls := map[string]interface {
			scriptCall
			argsAppender
		}{
			"activate": &activateCall{jobKey: "j", lockKey: "l", dueKey: "d", leasesKey: "le", indexKey: "i",
				ownerAliveKey: "a", ownerParkedKey: "p", node: "n", nowMs: 12, lockTTLMs: 34, create: true, jobID: "id",
				topic: "t", tenant: "te", traceID: "tr", request: []byte("req"), rescueAtMs: 56, lockAfter: "keep",
				dueMs: 78, retentionS: 90, parkedOwner: "po", plan: p},
			"transition": &transitionCall{jobKey: "j", histKey: "h", lockKey: "l", dueKey: "d", leasesKey: "le",
				toIndexKey: "ti", fromIndexKeys: []string{"f1", "f2"}, lockValue: "n|1", node: "n", expected: "A,B",
				nowMs: 12, jobID: "id", lockAfter: "terminal", retentionS: 90, dueMs: -1, plan: p},
		}
		for name, c := range calls {
			want := []string{}
			for _, k := range c.keys() {
				want = append(want, k)
			}
			for _, a := range c.args() {
				want = append(want, argString(a))
			}
			got := []string{}
			for _, a := range c.appendArgs(c.appendKeys(nil)) {
				got = append(got, argString(a))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s (plan %v): appended\n%v\nwant\n%v", name, p.t != nil, got, want)
			}
			if c.keyCount() != len(c.keys()) {
				t.Errorf("%s: keyCount %d, keys %d", name, c.keyCount(), len(c.keys()))
			}
			if c.argCount() < len(got) {
				t.Errorf("%s: argCount %d < %d appended", name, c.argCount(), len(got))
			}
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
