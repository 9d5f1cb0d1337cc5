package faults_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/jobstate"
)

// Oversize garbage (1 MiB packets that never decode) arrives while jobs
// run, on a Redis capped by maxmemory with noeviction: the DLQ keeps a few
// KiB of each packet, Redis never runs out of memory, every packet is
// dead-lettered and every job succeeds. Before the DLQ was bounded in
// bytes, 200 such packets wanted 200 MiB: the DLQ filled Redis, its writes
// failed with OOM, and so did the jobs'.
func TestFaultOversizeGarbageUnderRedisMaxmemory(t *testing.T) {
	if testing.Short() {
		t.Skip("runs its own redis-server and nats-server")
	}
	const maxmemory = 64 << 20
	rport, nport := freePort(t), freePort(t)
	privateServer(t, "redis-server", "--port", strconv.Itoa(rport), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--maxmemory", strconv.Itoa(maxmemory), "--maxmemory-policy", "noeviction")
	privateServer(t, "nats-server", "-a", "127.0.0.1", "-p", strconv.Itoa(nport), "-js", "-sd", t.TempDir())
	waitPort(t, rport)
	waitPort(t, nport)
	redisURL := "redis://127.0.0.1:" + strconv.Itoa(rport)
	w := newWorld(t, "nats://127.0.0.1:"+strconv.Itoa(nport), redisURL)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(rport)})
	t.Cleanup(func() { _ = rdb.Close() })

	const packets = 200
	done := w.submitFor("og", 100, 4*time.Second)
	ctx := context.Background()
	for i := 0; i < packets; i++ {
		garbage := bytes.Repeat([]byte{0xff}, 1<<20-4096)
		garbage[len(garbage)-1] = byte(i) // distinct packets
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := w.js.Publish(pctx, w.subj.Submit, garbage)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	ids := <-done
	w.check(ids, 30*time.Second)

	deadline := time.Now().Add(30 * time.Second)
	for {
		es, err := inspect.Of(w.node).ListDLQ(ctx, 2*packets)
		n := 0
		for _, e := range es {
			if e.Reason == jobstate.ReasonDecodeFailed {
				n++
			}
		}
		if err == nil && n == packets {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d packets dead-lettered (%v)", n, packets, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	used := int64(0)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if used <= 0 || used > maxmemory/2 {
		t.Fatalf("Redis uses %d bytes after %d oversize packets (maxmemory %d)", used, packets, maxmemory)
	}
	t.Logf("%d jobs SUCCEEDED, 0 twice, alongside %d packets of 1 MiB garbage, all dead-lettered; Redis used_memory %.1f MiB (maxmemory %d MiB)",
		len(ids), packets, float64(used)/(1<<20), maxmemory>>20)
}
