package supervisor

import (
	"github.com/asynkron/protoactor-go/actor"
	cmap "github.com/orcaman/concurrent-map"
)

// RegistryBuckets is the number of buckets CompactRegistry leaves in an
// actor system's process registry.
const RegistryBuckets = 1

// CompactRegistry gives sys's process registry buckets concurrent maps
// instead of protoactor's 1,024 (each of them a concurrent map of 32
// shards, each shard a Go map: 32,768 maps). A node spawns, looks up and
// removes an actor per job under a name of its own (the job id), and with
// 32,768 maps each of those three touches a map of its own, cold in the
// CPU's caches — a few cache misses each, ~5 % of the node's CPU at full
// speed. One concurrent map keeps its 32 shards' maps warm, and its 32
// locks are more than a node's cores contend for.
//
// Call it right after actor.NewActorSystem, before the system is used: it
// moves what is registered (the dead letter process) to the new buckets
// and replaces the registry's buckets unguarded.
func CompactRegistry(sys *actor.ActorSystem, buckets int) {
	old := sys.ProcessRegistry.LocalPIDs
	sm := &actor.SliceMap{LocalPIDs: make([]cmap.ConcurrentMap, buckets)}
	for i := range sm.LocalPIDs {
		sm.LocalPIDs[i] = cmap.New()
	}
	if old != nil {
		for _, b := range old.LocalPIDs {
			b.IterCb(func(k string, v interface{}) { sm.GetBucket(k).Set(k, v) })
		}
	}
	sys.ProcessRegistry.LocalPIDs = sm
}
