package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// clusterSlot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its
// hash tag (the part between the first "{" and the next "}", when not
// empty) or of the whole key, mod 16384.
func clusterSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// scriptKeys returns the KEYS of an EVAL or EVALSHA command.
func scriptKeys(t *testing.T, cmd redis.Cmder) []string {
	t.Helper()
	a := cmd.Args()
	if len(a) < 3 {
		t.Fatalf("%v: not a script call", a)
	}
	n, ok := a[2].(int)
	if !ok || len(a) < 3+n {
		t.Fatalf("%v: no key count", a)
	}
	keys := make([]string, n)
	for i := range keys {
		switch k := a[3+i].(type) {
		case string:
			keys[i] = k
		case *string: // evalSha passes keys by pointer
			keys[i] = *k
		default:
			t.Fatalf("%v: key %d is a %T", a, i, a[3+i])
		}
	}
	return keys
}

func checkOneSlot(t *testing.T, what string, keys []string) {
	t.Helper()
	if len(keys) == 0 {
		t.Errorf("%s: no keys", what)
		return
	}
	for _, k := range keys[1:] {
		if clusterSlot(k) != clusterSlot(keys[0]) {
			t.Errorf("%s: %s (slot %d) and %s (slot %d) are in different slots", what,
				keys[0], clusterSlot(keys[0]), k, clusterSlot(k))
		}
	}
}

// TestScriptKeysShareOneSlot builds each script's call as the package does
// (without sending it) and checks that all of its KEYS hash to one Redis
// Cluster slot, as a cluster requires of one script call.
func TestScriptKeysShareOneSlot(t *testing.T) {
	if clusterSlot("foo") != 12182 || clusterSlot("{user1000}.following") != clusterSlot("{user1000}.followers") {
		t.Fatal("clusterSlot does not follow Redis Cluster's key hashing")
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: nothing is sent
	defer rdb.Close()
	s := New(rdb, Config{Prefix: "slots:"})
	ctx := context.Background()
	k := s.keys
	plan := &Transition{Expect: jobstate.Expect(jobstate.StateDispatched, jobstate.StateRunning),
		Path:   []Hop{{To: jobstate.StateScheduled, Reason: "r"}, {To: jobstate.StateDispatched, Reason: "r"}},
		Fields: []string{"worker", "w1"}, Op: "op1",
		Adds: []ShardZAdd{{Suffix: "saga:stack:wf", Score: 1, Member: "m", TTL: time.Hour}, {Suffix: "saga:triggers", Score: 2, Member: "wf"}},
		Sets: []ShardHSet{{Suffix: "saga:tmpl:wf", Field: "f", Value: "v", TTL: time.Hour}}}
	dlq := &DLQEntry{JobID: "j", Reason: "r"}
	for i := 0; i < 200; i++ {
		id := fmt.Sprintf("job-%d", i)
		ops := []*Op{
			{Kind: OpActivate, JobID: id, Node: "a", Create: true, T: plan, DLQ: dlq},
			{Kind: OpActivate, JobID: id, Node: "a", parkedOwner: "b", parkedOwnerKnown: true},
			{Kind: OpTransition, JobID: id, Node: "a", LockValue: "a|1", T: plan, DLQ: dlq},
			{Kind: OpRelease, JobID: id, Node: "a", LockValue: "a|1"},
			{Kind: OpPark, JobID: id, Node: "a", LockValue: "a|1", ParkDue: 5},
			{Kind: OpClaim, JobID: id, IdemKey: k.Idempotency("t", id)},
			{Kind: OpAdmit, JobID: id, TenantKey: k.TenantActive("t"), Limit: 3},
			{Kind: OpDowngrade, JobID: id, Node: "a", T: &Transition{Path: []Hop{{To: jobstate.StateOutputQuarantined, Reason: "r"}}}},
			{Kind: OpDLQ, JobID: id, DLQ: dlq},
		}
		pipe := rdb.Pipeline()
		for _, op := range ops {
			s.queue(ctx, pipe, op)
			if len(op.cmds) == 0 {
				t.Fatalf("op kind %d queued nothing", op.Kind)
			}
			checkOneSlot(t, fmt.Sprintf("op kind %d of %s", op.Kind, id), scriptKeys(t, op.cmds[0]))
		}
		sh := Shard(id)
		calls := map[string]scriptCall{
			"renew_many": renewManyCall{dueKey: k.Due(sh), locks: []renewedLock{{jobID: id, lockKey: k.Lock(id)},
				{jobID: id + "x", lockKey: k.Lock(id)}}},
			"approve":     approveCall{jobKey: k.Job(id), dueKey: k.Due(sh)},
			"cancel_mark": cancelMarkCall{jobKey: k.Job(id), markKey: k.CancelMark(id)},
			"due":         dueCall{setKey: k.Parked(sh, "a")},
			"due_scores":  dueCall{withScores: true, setKey: k.Due(sh), leasesKey: k.Leases(sh)},
			"trim":        trimCall{indexKey: k.Index(sh, "SUCCEEDED"), jobKeys: []string{k.Job(id)}, jobIDs: []string{id}},
			"dead_node":   deadNodeCall{nodesKey: k.Nodes()},
			"dlq_append":  dlqAppendCall{dlqKey: k.DLQ(), markKey: k.DLQMark(id)},
			"take_lease":  leaseCall{sc: takeLeaseScript, leaseKey: k.Prefix() + "lock:due-poller"},
		}
		for name, c := range calls {
			checkOneSlot(t, name, c.keys())
		}
	}
}
