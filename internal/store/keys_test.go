package store

import (
	"hash/fnv"
	"strconv"
	"strings"
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// The inline FNV-1a gives every id the shard hash/fnv gives it: a change
// would re-home every key.
func TestShardIsFNV1aOfTheID(t *testing.T) {
	ids := []string{"", "a", "job-1", "ünïcode-ид", "x" + string(make([]byte, 300))}
	for i := 0; i < 1000; i++ {
		ids = append(ids, "bench-"+strconv.Itoa(i))
	}
	for _, id := range ids {
		h := fnv.New32a()
		_, _ = h.Write([]byte(id))
		if got, want := Shard(id), int(h.Sum32()%Shards); got != want {
			t.Fatalf("Shard(%q) = %d, want %d", id, got, want)
		}
	}
}

// The shard keys looked up from the cache are the keys the documented
// layout names, for known and unknown states and for more nodes than the
// cache holds; a job op names them without allocating.
func TestShardKeysAreTheDocumentedNames(t *testing.T) {
	k := NewKeys("p:")
	for sh := 0; sh < Shards; sh++ {
		tag := "p:{" + strconv.Itoa(sh) + "}:"
		if k.Due(sh) != tag+"due" || k.Leases(sh) != tag+"leases" {
			t.Fatalf("shard %d: due %q leases %q", sh, k.Due(sh), k.Leases(sh))
		}
		for _, st := range append(jobstate.AllStates, "NOT_A_STATE") {
			if got := k.Index(sh, string(st)); got != tag+"idx:"+string(st) {
				t.Fatalf("Index(%d, %s) = %q", sh, st, got)
			}
		}
		for n := 0; n < maxCachedNodes+5; n++ {
			node := "node-" + strconv.Itoa(n)
			if k.Alive(sh, node) != tag+"alive:"+node || k.Parked(sh, node) != tag+"parked:"+node {
				t.Fatalf("shard %d node %s: alive %q parked %q", sh, node, k.Alive(sh, node), k.Parked(sh, node))
			}
		}
	}
	if n := k.nodeCount.Load(); n != maxCachedNodes {
		t.Fatalf("%d nodes cached, want the bound %d", n, maxCachedNodes)
	}
	allocs := testing.AllocsPerRun(100, func() {
		sh := Shard("job-42")
		keySink = len(k.Due(sh)) + len(k.Leases(sh)) + len(k.Index(sh, string(jobstate.StateDispatched))) +
			len(k.Alive(sh, "node-1")) + len(k.Parked(sh, "node-1"))
	})
	if allocs != 0 {
		t.Fatalf("looking up a job op's shard keys allocated %.0f times", allocs)
	}
}

var keySink int

// TestJobKeysAreJobLockCancelMark: the three keys a job's script calls
// name, cut from one string, are Job, Lock and CancelMark byte for byte
// (empty, short, long and non-ASCII ids; a prefix and none), and cost one
// allocation.
func TestJobKeysAreJobLockCancelMark(t *testing.T) {
	for _, prefix := range []string{"p:", ""} {
		k := NewKeys(prefix)
		for _, id := range []string{"", "j", "r0123456789-12345", strings.Repeat("x", 300), "é|{}:"} {
			job, lock, mark := k.jobKeys(Shard(id), id)
			if job != k.Job(id) || lock != k.Lock(id) || mark != k.CancelMark(id) {
				t.Errorf("prefix %q id %q: %q %q %q, want %q %q %q", prefix, id, job, lock, mark, k.Job(id), k.Lock(id), k.CancelMark(id))
			}
		}
	}
	k := NewKeys("p:")
	if n := testing.AllocsPerRun(100, func() { k.jobKeys(3, "r0123456789-12345") }); n != 1 {
		t.Errorf("%v allocations, want 1", n)
	}
}

// TestStateSlotKnowsEveryState: each state has a slot of its own in the
// shard's index keys (a state added to jobstate.AllStates fails here until
// stateSlot knows it), and a string that only looks like a state has none
// (its key is built per call, as before).
func TestStateSlotKnowsEveryState(t *testing.T) {
	if len(jobstate.AllStates) != stateSlots {
		t.Fatalf("%d states, stateSlots %d", len(jobstate.AllStates), stateSlots)
	}
	seen := map[int]jobstate.State{}
	for _, st := range jobstate.AllStates {
		i := stateSlot(string(st))
		if i < 0 || i >= stateSlots {
			t.Fatalf("stateSlot(%s) = %d", st, i)
		}
		if other, ok := seen[i]; ok {
			t.Fatalf("%s and %s share slot %d", st, other, i)
		}
		seen[i] = st
	}
	for _, s := range []string{"", "pending", "PENDING ", "SUCCEEDE", "idx:RUNNING", "NOT_A_STATE"} {
		if i := stateSlot(s); i != -1 {
			t.Fatalf("stateSlot(%q) = %d, want -1", s, i)
		}
	}
}

// BenchmarkKeysIndex: a job op's index keys (its create's, a transition's
// from and to). Against the map it replaced, 12–22 → 3.5–4.7 ns (2 runs of
// each, alternated, 2026-11-27, load ~10).
func BenchmarkKeysIndex(b *testing.B) {
	k := NewKeys("troupe:")
	states := []string{string(jobstate.StateDispatched), string(jobstate.StateSucceeded), string(jobstate.StateScheduled)}
	n := 0
	for i := 0; i < b.N; i++ {
		n += len(k.Index(i%Shards, states[i%len(states)]))
	}
	keySink = n
}
