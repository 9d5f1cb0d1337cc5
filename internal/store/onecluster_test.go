package store

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// startOneMasterCluster runs a private redis-server in cluster mode that
// serves every slot itself, the way a one-master Redis Cluster does, and
// returns its address. The test is skipped without a redis-server.
func startOneMasterCluster(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("no redis-server on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--cluster-enabled", "yes",
		"--cluster-config-file", filepath.Join(dir, "nodes.conf"), "--save", "", "--appendonly", "no",
		"--dir", dir, "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		_ = out.Close()
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx := context.Background()
	// Up to 10 s in 20 ms steps: listening, then every slot served.
	for i := 0; ; i++ {
		if i == 500 {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("the cluster node at %s is not ready: %s", addr, log)
		}
		if c.Ping(ctx).Err() == nil {
			info, _ := c.ClusterInfo(ctx).Result()
			if strings.Contains(info, "cluster_state:ok") {
				return addr
			}
			if strings.Contains(info, "cluster_slots_assigned:0") {
				_ = c.Do(ctx, "cluster", "addslotsrange", 0, 16383).Err()
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOneAddressClusterCallsStayInOneSlot checks a Redis Cluster that the
// store reaches through a plain client (one address, as a single seed
// gives): LoadScripts learns that the server is a cluster node, so a
// flush of jobs of several shards is grouped per shard only, and every job
// applies. Grouped whatever their shards, they failed with CROSSSLOT.
func TestOneAddressClusterCallsStayInOneSlot(t *testing.T) {
	t.Parallel()
	addr := startOneMasterCluster(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	s := New(rdb, Config{Prefix: "onecluster:", LockTTL: 10 * time.Second})
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	var acts []*Op
	shards := map[int]bool{}
	for i := 0; i < 40; i++ {
		id := fmt.Sprintf("one-%d", i)
		shards[Shard(id)] = true
		acts = append(acts, &Op{Kind: OpActivate, JobID: id, Node: "a", Create: true, Topic: "job.x",
			Tenant: "t", TraceID: "tr", Request: []byte("req"),
			T: &Transition{Path: []Hop{{To: jobstate.StateScheduled, Reason: "r"}}, Op: "c" + id}})
	}
	if len(shards) < 2 {
		t.Fatalf("the jobs are in %d shard, want several", len(shards))
	}
	w := &Writer{s: s, timeout: WriterTimeoutDefault}
	for i, r := range execBatch(t, w, acts) {
		if r.Err != nil || r.Status != ActivateCreated || r.State != jobstate.StateScheduled {
			t.Errorf("activation of %s: %+v (%v)", acts[i].JobID, r, r.Err)
		}
	}
}
