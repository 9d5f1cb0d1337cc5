package bench

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/testenv"
)

// TestRedisAddressesMakeTheRightClient: one address is one server, several
// separated by commas are a Redis Cluster's seeds (as troupe node takes
// them), and a list that does not parse is refused.
func TestRedisAddressesMakeTheRightClient(t *testing.T) {
	t.Parallel()
	one, _, err := newCountedClient("redis://127.0.0.1:6379")
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	if _, ok := one.(*redis.Client); !ok {
		t.Errorf("one address: %T, want *redis.Client", one)
	}
	many, _, err := newCountedClient("127.0.0.1:7001, 127.0.0.1:7002,redis://127.0.0.1:7003")
	if err != nil {
		t.Fatal(err)
	}
	defer many.Close()
	cc, ok := many.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("three addresses: %T, want *redis.ClusterClient", many)
	}
	if got := strings.Join(cc.Options().Addrs, ","); got != "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003" {
		t.Errorf("cluster seeds %s", got)
	}
	if _, _, err := newCountedClient("127.0.0.1:7001,redis://127.0.0.1:7002/3"); err == nil {
		t.Error("a cluster seed selecting db 3 was accepted")
	}
}

// TestBenchClusterSmoke runs the bench on a Redis Cluster of three local
// masters it starts itself: two Troupe nodes with stock CAP workers, and
// the floor. Every job must end SUCCEEDED exactly once, the report must
// carry each master's figures and each node's, and the run must leave no
// key on any master.
func TestBenchClusterSmoke(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"redis-server"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not on PATH", bin)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := StartLocalCluster(ctx, 3, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	for _, target := range []Target{TargetTroupe, TargetFloor} {
		t.Run(string(target), func(t *testing.T) {
			env := testenv.New(t)
			cfg := smokeConfig(t, env, target)
			cfg.RedisURL, cfg.WorkerMode, cfg.RunID = cl.URLs(), WorkerCAP, env.Prefix+"c"+string(target[0])
			if target == TargetTroupe {
				cfg.Nodes = 2
			}
			res, err := Run(ctx, cfg)
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			var sum strings.Builder
			FormatReport(&sum, res)
			t.Log("\n" + sum.String())
			if j := res.Jobs; !res.OK || j.Succeeded != cfg.Jobs || j.Duplicates != 0 {
				t.Fatalf("want %d SUCCEEDED exactly once; got %+v (failures %v)", cfg.Jobs, j, res.Failures)
			}
			if res.Params.RedisMasters != 3 || len(res.Redis.Masters) != 3 {
				t.Fatalf("%d masters in the params, %d in the report; want 3", res.Params.RedisMasters, len(res.Redis.Masters))
			}
			for _, m := range res.Redis.Masters {
				if m.Commands <= 0 || !strings.HasPrefix(m.Addr, "127.0.0.1:") {
					t.Errorf("master %+v: no commands counted", m)
				}
			}
			if res.Ceilings.BusiestMaster == "" || res.Ceilings.RedisMasterJobsPerSec <= 0 {
				t.Errorf("ceilings %+v: want the busiest master's", res.Ceilings)
			}
			if target == TargetTroupe {
				var created int64
				for _, n := range res.PerNode {
					created += n.Created
				}
				if len(res.PerNode) != 2 || created != int64(cfg.Jobs) {
					t.Errorf("per node %+v: want two nodes creating %d jobs between them", res.PerNode, cfg.Jobs)
				}
			}
			// Nothing left on any master.
			for _, a := range cl.Addrs {
				c := redis.NewClient(&redis.Options{Addr: a})
				keys, err := c.Keys(ctx, PrefixesFor(cfg.RunID).Key+"*").Result()
				_ = c.Close()
				if err != nil || len(keys) != 0 {
					t.Errorf("master %s: %d keys left behind (%v)", a, len(keys), err)
				}
			}
		})
	}
}
