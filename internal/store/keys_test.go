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
