package faults_test

// Private server clusters for the cluster tests: three redis-server
// processes formed into a Redis Cluster, and three nats-server processes
// routed into a JetStream cluster. Every server is a child process on free
// loopback ports with its files under t.TempDir(), killed at test end.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterProc is one server process of a test.
type clusterProc struct {
	name string
	cmd  *exec.Cmd
	log  string
}

// startClusterProc runs bin with args, its output in a log file that is printed if
// the test fails, and kills it (SIGKILL) at test end.
func startClusterProc(t *testing.T, name, bin string, args ...string) *clusterProc {
	t.Helper()
	if _, err := exec.LookPath(bin); err != nil {
		t.Skipf("%s not installed", bin)
	}
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &clusterProc{name: name, cmd: cmd, log: logPath}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		_ = f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s log (tail):\n%s", name, b)
		}
	})
	return p
}

// listening reports whether something accepts connections on port within d.
func listening(port int, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 100*time.Millisecond); err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// kill9 kills the process with SIGKILL and reaps it.
func (p *clusterProc) kill9() {
	_ = p.cmd.Process.Kill()
	_, _ = p.cmd.Process.Wait()
}

// redisCluster is a 3-master Redis Cluster of child processes.
type redisCluster struct {
	addrs []string
	procs []*clusterProc
}

// startRedisCluster starts three redis-server processes with cluster mode
// on, joins them with `redis-cli --cluster create` (no replicas: 3 masters,
// 5461 slots each) and waits, bounded, until every node reports
// cluster_state:ok and sees the whole slot map.
func startRedisCluster(t *testing.T) *redisCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("redis-cli not installed")
	}
	dir := t.TempDir()
	rc := &redisCluster{}
	for i := 0; i < 3; i++ {
		// A free port may be taken by another process before the server
		// binds it (tests run side by side): try fresh ports, a few times.
		for attempt := 1; ; attempt++ {
			port, busPort := freePort(t), freePort(t)
			p := strconv.Itoa(port)
			proc := startClusterProc(t, "redis-"+p, "redis-server", "--port", p, "--bind", "127.0.0.1",
				"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(busPort),
				"--cluster-config-file", filepath.Join(dir, "nodes-"+p+".conf"), "--cluster-node-timeout", "5000",
				"--save", "", "--appendonly", "no", "--dir", dir)
			if listening(port, 5*time.Second) {
				rc.procs = append(rc.procs, proc)
				rc.addrs = append(rc.addrs, "127.0.0.1:"+p)
				break
			}
			proc.kill9()
			if attempt == 5 {
				t.Fatalf("redis-server never listened on a free port in %d attempts", attempt)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, rc.addrs...)
	out, err := exec.CommandContext(ctx, "redis-cli", append(args, "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, a := range rc.addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") &&
				strings.Contains(info, "cluster_slots_ok:16384") {
				break
			}
			if ctx.Err() != nil {
				_ = c.Close()
				t.Fatalf("redis node %s never reached cluster_state:ok: %v %s", a, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.Close()
	}
	return rc
}

// clusterNATSServer is one nats-server of a cluster.
type clusterNATSServer struct {
	*clusterProc
	name        string
	port        int
	monitorPort int
	storeDir    string
}

func (s *clusterNATSServer) url() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// natsCluster is a JetStream cluster of nats-server child processes.
type natsCluster struct {
	servers []*clusterNATSServer
}

// urls is the comma-separated list of every server's client URL, as a
// client's connect string.
func (nc *natsCluster) urls() string {
	var u []string
	for _, s := range nc.servers {
		u = append(u, s.url())
	}
	return strings.Join(u, ",")
}

// byName returns the server named name (nil if none).
func (nc *natsCluster) byName(name string) *clusterNATSServer {
	for _, s := range nc.servers {
		if s.name == name {
			return s
		}
	}
	return nil
}

// startNATSCluster starts n nats-server processes with JetStream, each
// routed to the others on loopback, each with its own store directory and
// monitoring port, and waits (bounded) until JetStream has a meta leader.
func startNATSCluster(t *testing.T, n int) *natsCluster {
	t.Helper()
	nc := &natsCluster{}
	routePorts := make([]int, n)
	for i := range routePorts {
		routePorts[i] = freePort(t)
	}
	var routes []string
	for _, p := range routePorts {
		routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(p))
	}
	for i := 0; i < n; i++ {
		s := &clusterNATSServer{name: fmt.Sprintf("n%d", i+1), port: freePort(t), monitorPort: freePort(t),
			storeDir: filepath.Join(t.TempDir(), fmt.Sprintf("js-%d", i+1))}
		s.clusterProc = startClusterProc(t, "nats-"+s.name, "nats-server", "-a", "127.0.0.1", "-p", strconv.Itoa(s.port),
			"-n", s.name, "-m", strconv.Itoa(s.monitorPort), "-js", "-sd", s.storeDir,
			"--cluster_name", "troupe-test", "--cluster", "nats://127.0.0.1:"+strconv.Itoa(routePorts[i]),
			"--routes", strings.Join(routes, ","))
		nc.servers = append(nc.servers, s)
	}
	for _, s := range nc.servers {
		waitPort(t, s.port)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if nc.metaReady(n) {
			return nc
		}
		if time.Now().After(deadline) {
			t.Fatal("the NATS cluster never elected a JetStream meta leader with every peer current")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// metaReady reports whether some server leads the JetStream meta group and
// sees the n-1 others as current replicas.
func (nc *natsCluster) metaReady(n int) bool {
	client := &http.Client{Timeout: time.Second}
	for _, s := range nc.servers {
		resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(s.monitorPort) + "/jsz")
		if err != nil {
			continue
		}
		var j clusterJSZ
		err = json.NewDecoder(resp.Body).Decode(&j)
		_ = resp.Body.Close()
		if err != nil || j.Meta == nil || j.Meta.Leader == "" || j.Meta.Leader != s.name {
			continue
		}
		current := 0
		for _, r := range j.Meta.Replicas {
			if r.Current {
				current++
			}
		}
		return current >= n-1
	}
	return false
}

// clusterJSZ is the part of a server's /jsz monitoring answer the tests read.
type clusterJSZ struct {
	Meta *struct {
		Leader   string `json:"leader"`
		Replicas []struct {
			Name    string `json:"name"`
			Current bool   `json:"current"`
		} `json:"replicas"`
	} `json:"meta_cluster"`
}

// metaLeader asks the live servers' monitoring endpoints who leads the
// JetStream meta group.
func (nc *natsCluster) metaLeader() (string, error) {
	client := &http.Client{Timeout: time.Second}
	var lastErr error
	for _, s := range nc.servers {
		resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(s.monitorPort) + "/jsz")
		if err != nil {
			lastErr = err
			continue
		}
		var j clusterJSZ
		err = json.NewDecoder(resp.Body).Decode(&j)
		_ = resp.Body.Close()
		if err == nil && j.Meta != nil && j.Meta.Leader != "" {
			return j.Meta.Leader, nil
		}
		lastErr = err
	}
	return "", lastErr
}
