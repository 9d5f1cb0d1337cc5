package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/testenv"
)

// queuedOnly keeps the command evalShaMulti would send, unsent.
type queuedOnly struct{ cmd redis.Cmder }

func (q *queuedOnly) Process(_ context.Context, cmd redis.Cmder) error { q.cmd = cmd; return nil }

// packedTestCalls are hot-path calls whose arguments cover each
// MessagePack string header (up to 31 bytes, 8-, 16- and 32-bit lengths),
// empty and binary values, negative numbers, hops, shard writes, a DLQ
// outbox entry and a create's packed fields.
func packedTestCalls() []hotScriptCall {
	req := []byte("\x00\xff\r\n$3\r\n" + strings.Repeat("r", 70000))
	plan := &Transition{Expect: jobstate.Expect(jobstate.StateDispatched, jobstate.StateRunning),
		Path: []Hop{{To: jobstate.StateScheduled, Reason: "r1"}, {To: jobstate.StateDispatched, Reason: ""}},
		Fields: []string{"worker", strings.Repeat("w", 31), "error_message", strings.Repeat("e", 300), "empty", "",
			"policy_reason", strings.Repeat("p", 40), "sub", "\x00now"},
		Op:   "op1",
		Adds: []ShardZAdd{{Suffix: "saga:stack:wf", Score: -5, Member: strings.Repeat("m", 32), TrimBelow: 3, TTL: time.Hour}},
		Sets: []ShardHSet{{Suffix: "saga:tmpl:wf", Field: "f", Value: strings.Repeat("v", 255), TTL: time.Hour}}}
	withPlan := planArgs{t: plan, tag: "x{1}:", extra: &ShardZAdd{Suffix: dlqOutboxSuffix, Score: 9, Member: "entry"}}
	return []hotScriptCall{
		&activateCall{jobKey: "j", lockKey: "l", dueKey: "d", leasesKey: "le", indexKey: "i",
			ownerAliveKey: "a", ownerParkedKey: "p", markKey: "m", cancelledKey: "c", node: "n", nowMs: 1764215000123,
			lockTTLMs: 34, create: true, jobID: "id", topic: "t", tenant: "te", traceID: "tr", request: req,
			rescueAtMs: 56, lockAfter: "keep", dueMs: -1, parkedOwner: "po"},
		&activateCall{jobKey: "j2", lockKey: "l2", dueKey: "d", leasesKey: "le", indexKey: "i",
			ownerAliveKey: "a", ownerParkedKey: "p", markKey: "m2", cancelledKey: "c", node: "n", create: true,
			jobID: "id2", topic: strings.Repeat("t", 256), request: nil, lockAfter: "keep", parkedOwner: "po", plan: withPlan},
		&activateCall{jobKey: "j3", lockKey: "l3", dueKey: "d", leasesKey: "le", indexKey: "i",
			ownerAliveKey: "a", ownerParkedKey: "p", markKey: "m3", cancelledKey: "c", node: "n", create: true, newOnly: true,
			jobID: "id3", topic: "t", request: req, lockAfter: "keep", parkedOwner: "po", plan: withPlan},
		&transitionCall{jobKey: "j", lockKey: "l", dueKey: "d", toIndexKey: "ti", fromIndexKeys: []string{"f1", "f2"},
			lockValue: "n|1", node: "n", expected: "A,B", nowMs: 12, jobID: "id", lockAfter: "terminal", dueMs: -1,
			plan: withPlan},
		&transitionCall{jobKey: "j3", lockKey: "l3", dueKey: "d", toIndexKey: "ti", fromIndexKeys: []string{"f1"},
			lockValue: "", node: "n", expected: "A", jobID: "id3", lockAfter: "keep"},
	}
}

// A multi-job call passes its jobs' arguments packed in one (packedargs.go):
// Redis's cmsgpack must decode, job by job, the very strings each call's
// own ARGV holds — what go-redis writes of appendArgs — so that each job's
// run of the script, and the record and keys it writes, are byte for byte
// those of a call of its own. The keys stay the call's own, in order.
func TestPackedArgsDecodeToEachCallsOwnArgv(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	if env.RedisEmbedded() {
		t.Skip("the embedded store has no cmsgpack; it makes no multi-job calls")
	}
	ctx := context.Background()
	calls := packedTestCalls()
	var q queuedOnly
	packers := make([]packer, len(calls))
	for i, c := range calls {
		packers[i] = c
	}
	multi := evalShaMulti(ctx, &q, transitionMultiScript, packers)
	if multi.Err() != nil || q.cmd == nil {
		t.Fatalf("multi-job call not queued: %v", multi.Err())
	}
	args := multi.Args()
	var wantKeys []string
	for _, c := range calls {
		wantKeys = append(wantKeys, keyStrings(c.appendKeys(nil))...)
	}
	if got := keyStrings(args[3 : len(args)-1]); args[2] != len(wantKeys) || fmt.Sprint(got) != fmt.Sprint(wantKeys) {
		t.Fatalf("keys %d %q, want %d %q", args[2], got, len(wantKeys), wantKeys)
	}
	decoded, err := env.Client.Eval(ctx, `return cmsgpack.unpack(ARGV[1])`, nil, args[len(args)-1]).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(decoded) != len(calls) {
		t.Fatalf("%d jobs decoded, want %d", len(decoded), len(calls))
	}
	for j, c := range calls {
		// ARGV as Redis gives it to a call of its own.
		own, err := env.Client.Eval(ctx, `return ARGV`, nil, c.appendArgs(nil)...).StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		job := decoded[j].([]interface{})
		if n, ok := job[0].(int64); !ok || int(n) != c.keyCount() {
			t.Errorf("job %d: key count %v, want %d", j, job[0], c.keyCount())
		}
		if len(job)-1 != len(own) {
			t.Fatalf("job %d: %d arguments decoded, want %d", j, len(job)-1, len(own))
		}
		for i, want := range own {
			if got, ok := job[1+i].(string); !ok || got != want {
				t.Errorf("job %d ARGV[%d]: %.40q (%T), want %.40q", j, i+1, job[1+i], job[1+i], want)
			}
		}
	}
	recycleMulti(args)
}

// A job's reply of a multi-job call comes packed by Redis's cmsgpack.pack
// (lua/lib/multi.lua); the Writer reads its strings in place. Every string
// length's header decodes to the string itself, and a reply cut short
// anywhere, or with bytes after it, is an error, not a panic.
func TestPackedRepliesReadAsTheScriptsStrings(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	if env.RedisEmbedded() {
		t.Skip("the embedded store has no cmsgpack; it makes no multi-job calls")
	}
	want := []string{"CREATED", "", "\x00\xff\r\n", strings.Repeat("a", 31), strings.Repeat("b", 32),
		strings.Repeat("c", 255), strings.Repeat("d", 256), strings.Repeat("e", 1<<16)}
	args := make([]interface{}, len(want))
	for i, w := range want {
		args[i] = w
	}
	packed, err := env.Client.Eval(context.Background(),
		`local t = {} for i = 1, #ARGV do t[i] = ARGV[i] end return cmsgpack.pack(t)`, nil, args...).Text()
	if err != nil {
		t.Fatal(err)
	}
	got, err := appendPackedReply(nil, packed)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d strings read, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("element %d: %.40q, want %.40q", i+1, got[i], want[i])
		}
	}
	for n := 0; n < len(packed); n++ {
		if _, err := appendPackedReply(nil, packed[:n]); err == nil {
			t.Fatalf("a reply cut at %d of %d bytes read without an error", n, len(packed))
		}
	}
	if _, err := appendPackedReply(nil, packed+"x"); err == nil {
		t.Fatal("a reply with a byte after it read without an error")
	}
}
