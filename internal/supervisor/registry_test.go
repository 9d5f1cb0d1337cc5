package supervisor_test

import (
	"io"
	"log/slog"
	"strconv"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/supervisor"
)

func quietSystem() *actor.ActorSystem {
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
}

// TestCompactRegistryKeepsWhatWasRegistered: the processes registered
// before the registry is compacted (the dead letter process, a named
// actor) are still found, and named actors spawned after it are found by
// name, refused a second time while live, and gone once stopped.
func TestCompactRegistryKeepsWhatWasRegistered(t *testing.T) {
	sys := quietSystem()
	defer sys.Shutdown()
	before, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "before")
	if err != nil {
		t.Fatal(err)
	}
	supervisor.CompactRegistry(sys, supervisor.RegistryBuckets)
	if len(sys.ProcessRegistry.LocalPIDs.LocalPIDs) != supervisor.RegistryBuckets {
		t.Fatalf("buckets %d, want %d", len(sys.ProcessRegistry.LocalPIDs.LocalPIDs), supervisor.RegistryBuckets)
	}
	if p, ok := sys.ProcessRegistry.GetLocal("deadletter"); !ok || p != sys.DeadLetter {
		t.Fatalf("dead letter process not kept: %v %v", p, ok)
	}
	if _, ok := sys.ProcessRegistry.GetLocal(before.Id); !ok {
		t.Fatal("an actor registered before the compaction is not found")
	}
	pid, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "job-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sys.ProcessRegistry.GetLocal(pid.Id); !ok {
		t.Fatal("an actor spawned after the compaction is not found")
	}
	if _, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(actor.Context) {}), "job-1"); err == nil {
		t.Fatal("a second actor under a live name was spawned")
	}
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	if _, ok := sys.ProcessRegistry.GetLocal(pid.Id); ok {
		t.Fatal("a stopped actor is still registered")
	}
}

// BenchmarkProcessRegistry is the process registry's work for one job
// actor (Add at its spawn, a Get as a fresh PID is first used, Remove at
// its stop) with live actors live at once, with protoactor's 1,024
// buckets and with CompactRegistry's.
func BenchmarkProcessRegistry(b *testing.B) {
	const names = 1 << 17
	ids := make([]string, names)
	for i := range ids {
		ids[i] = "$" + strconv.Itoa(i%64) + "/01JD" + strconv.FormatInt(int64(i)*7919+1e15, 36) + "-job"
	}
	for _, live := range []int{2048, 16384} {
		for _, buckets := range []int{1024, supervisor.RegistryBuckets} {
			b.Run("live="+strconv.Itoa(live)+"/buckets="+strconv.Itoa(buckets), func(b *testing.B) {
				sys := quietSystem()
				defer sys.Shutdown()
				if buckets != 1024 {
					supervisor.CompactRegistry(sys, buckets)
				}
				reg := sys.ProcessRegistry
				var proc actor.Process = sys.DeadLetter
				for i := 0; i < live; i++ {
					reg.Add(proc, ids[i])
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					pid, _ := reg.Add(proc, ids[(i+live)%names])
					reg.Get(pid)
					reg.Remove(&actor.PID{Id: ids[i%names]})
				}
			})
		}
	}
}
