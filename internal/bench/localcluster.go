package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Redis Cluster of local redis-server processes, for a run that measures
// what a cluster deployment does without one at hand (--redis-cluster N):
// N masters on free loopback ports, no replicas, the 16,384 slots split
// evenly, files in a temporary directory; Stop kills the servers and removes
// the directory. On Linux each server also dies with the bench process
// (a parent-death signal).

// Bounds of forming a local cluster.
const (
	// clusterListenTimeout bounds the wait for one server to accept
	// connections; clusterFormTimeout the wait for every server to report
	// cluster_state:ok with every slot and every master known.
	clusterListenTimeout = 10 * time.Second
	clusterFormTimeout   = 30 * time.Second
	clusterPortAttempts  = 5
	// clusterSlots is Redis Cluster's fixed slot count.
	clusterSlots = 16384
)

// LocalCluster is a Redis Cluster of redis-server child processes.
type LocalCluster struct {
	// Addrs are the masters' host:port, the --redis value joined by commas.
	Addrs []string
	dir   string
	procs []*exec.Cmd
	logs  []*os.File
}

// URLs is the address list a client takes: the masters joined by commas.
func (c *LocalCluster) URLs() string { return strings.Join(c.Addrs, ",") }

// StartLocalCluster starts n redis-server processes (bin: the redis-server
// command, "" for the one on PATH) with cluster mode on, assigns each an
// equal range of slots, joins them with CLUSTER MEET and waits, bounded,
// until every server reports the cluster whole. On error nothing is left
// running.
func StartLocalCluster(ctx context.Context, n int, bin string) (_ *LocalCluster, err error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: a cluster needs at least one master", ErrConfig)
	}
	if bin == "" {
		bin = "redis-server"
	}
	if _, lerr := exec.LookPath(bin); lerr != nil {
		return nil, fmt.Errorf("bench: redis cluster: %w", lerr)
	}
	dir, err := os.MkdirTemp("", "troupe-bench-cluster-")
	if err != nil {
		return nil, err
	}
	c := &LocalCluster{dir: dir}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	ports := make([]int, n)
	busPorts := make([]int, n)
	for i := range n {
		if ports[i], busPorts[i], err = c.startServer(ctx, bin, i); err != nil {
			return nil, err
		}
	}
	fctx, cancel := context.WithTimeout(ctx, clusterFormTimeout)
	defer cancel()
	clients := make([]*redis.Client, n)
	for i, a := range c.Addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a})
		defer clients[i].Close()
	}
	for i, cl := range clients {
		// A distinct config epoch per master from the start: no collision
		// for the cluster to resolve before it agrees on the slot map.
		if err := cl.Do(fctx, "cluster", "set-config-epoch", i+1).Err(); err != nil {
			return nil, fmt.Errorf("bench: redis cluster %s: set-config-epoch: %w", c.Addrs[i], err)
		}
		lo, hi := i*clusterSlots/n, (i+1)*clusterSlots/n-1
		if err := cl.ClusterAddSlotsRange(fctx, lo, hi).Err(); err != nil {
			return nil, fmt.Errorf("bench: redis cluster %s: addslots %d-%d: %w", c.Addrs[i], lo, hi, err)
		}
	}
	for i := 1; i < n; i++ {
		if err := clients[0].Do(fctx, "cluster", "meet", "127.0.0.1", ports[i], busPorts[i]).Err(); err != nil {
			return nil, fmt.Errorf("bench: redis cluster: meet %s: %w", c.Addrs[i], err)
		}
	}
	want := []string{"cluster_state:ok", "cluster_slots_ok:" + strconv.Itoa(clusterSlots),
		"cluster_known_nodes:" + strconv.Itoa(n)}
	for i, cl := range clients {
		for {
			info, err := cl.ClusterInfo(fctx).Result()
			if err == nil && containsAll(info, want) {
				break
			}
			if fctx.Err() != nil {
				return nil, fmt.Errorf("bench: redis cluster: %s not whole after %s (%v): %s",
					c.Addrs[i], clusterFormTimeout, err, firstLines(info, 6))
			}
			sleepCtx(fctx, 20*time.Millisecond)
		}
	}
	return c, nil
}

// startServer starts master i on a free port (and a free cluster bus port),
// trying fresh ports a few times: another process may take a free port
// before the server binds it.
func (c *LocalCluster) startServer(ctx context.Context, bin string, i int) (port, busPort int, err error) {
	for attempt := 1; ; attempt++ {
		if port, err = freePort(); err != nil {
			return 0, 0, err
		}
		if busPort, err = freePort(); err != nil {
			return 0, 0, err
		}
		p := strconv.Itoa(port)
		logf, err := os.Create(filepath.Join(c.dir, "redis-"+p+".log"))
		if err != nil {
			return 0, 0, err
		}
		cmd := exec.Command(bin, "--port", p, "--bind", "127.0.0.1", "--protected-mode", "no",
			"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(busPort),
			"--cluster-config-file", filepath.Join(c.dir, "nodes-"+p+".conf"), "--cluster-node-timeout", "5000",
			"--save", "", "--appendonly", "no", "--dir", c.dir)
		cmd.Stdout, cmd.Stderr = logf, logf
		dieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			_ = logf.Close()
			return 0, 0, fmt.Errorf("bench: redis cluster: start %s: %w", bin, err)
		}
		if listening(ctx, port, clusterListenTimeout) {
			c.procs, c.logs = append(c.procs, cmd), append(c.logs, logf)
			c.Addrs = append(c.Addrs, "127.0.0.1:"+p)
			return port, busPort, nil
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logf.Close()
		if attempt == clusterPortAttempts || ctx.Err() != nil {
			b, _ := os.ReadFile(logf.Name())
			return 0, 0, fmt.Errorf("bench: redis cluster: master %d never listened (%d attempts): %s",
				i+1, attempt, firstLines(string(b), 10))
		}
	}
}

// Stop kills the servers and removes their directory.
func (c *LocalCluster) Stop() {
	for i, cmd := range c.procs {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = c.logs[i].Close()
	}
	c.procs, c.logs = nil, nil
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	ta, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, fmt.Errorf("bench: unexpected listener address %v", l.Addr())
	}
	return ta.Port, nil
}

// listening reports whether something accepts connections on the loopback
// port within d.
func listening(ctx context.Context, port int, d time.Duration) bool {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	for deadline := time.Now().Add(d); time.Now().Before(deadline) && ctx.Err() == nil; sleepCtx(ctx, 20*time.Millisecond) {
		if conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			_ = conn.Close()
			return true
		}
	}
	return false
}

func containsAll(s string, subs []string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

// firstLines is s's first n lines, trimmed.
func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
