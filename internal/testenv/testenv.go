// Package testenv gives tests real servers: the Redis on 127.0.0.1:6379 and
// the NATS (JetStream) on 127.0.0.1:4222 when they answer, and otherwise an
// in-process NATS server and the embedded Redis-protocol store, started once
// per test binary. Every test gets its own key prefix, subject prefix and
// stream prefix, so tests share servers and still run in parallel.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/embedded"
)

// Default service addresses (override with TROUPE_TEST_REDIS / TROUPE_TEST_NATS,
// or set them to "embedded" to force the in-process servers).
//
// TROUPE_TEST_REDIS_CLUSTER=host:port,host:port,... runs the tests against a
// Redis Cluster instead: Env.Client is then a cluster client, and Env.Redis
// and Env.RedisURL are unset (a single-node client would only meet MOVED
// replies), so only tests that use Env.Client (the store package's) run
// there; faults/TestRedisCluster starts a cluster and runs them so.
const (
	RedisAddrDefault = "127.0.0.1:6379"
	NATSAddrDefault  = "127.0.0.1:4222"
)

var (
	once     sync.Once
	redisURL string
	cluster  []string
	natsURL  string
	kinds    string
)

func reachable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func setup() {
	ra := envOr("TROUPE_TEST_REDIS", RedisAddrDefault)
	na := envOr("TROUPE_TEST_NATS", NATSAddrDefault)
	var k []string
	if v := os.Getenv("TROUPE_TEST_REDIS_CLUSTER"); v != "" {
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cluster = append(cluster, a)
			}
		}
		k = append(k, "redis-cluster="+strings.Join(cluster, ","))
	} else if ra != "embedded" && reachable(ra) {
		redisURL = "redis://" + ra
		k = append(k, "redis="+ra)
	} else {
		r, err := embedded.StartRedis()
		if err != nil {
			panic(err)
		}
		redisURL = r.URL()
		k = append(k, "redis=embedded")
	}
	if na != "embedded" && reachable(na) {
		natsURL = "nats://" + na
		k = append(k, "nats="+na)
	} else {
		n, err := embedded.StartNATS()
		if err != nil {
			panic(err)
		}
		natsURL = n.URL()
		k = append(k, "nats=embedded")
	}
	kinds = strings.Join(k, " ")
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Env is one test's slice of the shared servers.
type Env struct {
	RedisURL string
	NATSURL  string
	// Prefix is unique to the test: use it for keys ("<prefix>:"), subjects
	// ("<prefix>.") and streams.
	Prefix string
	// Redis is a client of the single Redis (nil against a cluster).
	Redis *redis.Client
	// Client is the test's Redis client: Redis, or a cluster client when
	// TROUPE_TEST_REDIS_CLUSTER is set.
	Client redis.UniversalClient
	// RedisCluster lists the cluster's seed addresses (nil without one).
	RedisCluster []string
	NATS         *nats.Conn
}

// New returns the test's environment; connections close at test end and the
// test's Redis keys are deleted.
func New(t testing.TB) *Env {
	t.Helper()
	once.Do(setup)
	t.Logf("testenv: %s", kinds)
	return newEnv(t, natsURL)
}

// NewWithPrivateNATS is New with a NATS server of the test's own: an
// in-process nats-server with JetStream, its store in a temporary directory,
// stopped at test end. For tests that delete and recreate streams: the
// nats-server 2.9 binary's file store, shared with tests doing the same at
// once, was seen to refuse a recreated stream ("error opening msg block
// file ... no such file or directory").
func NewWithPrivateNATS(t testing.TB) *Env {
	t.Helper()
	once.Do(setup)
	ns, err := embedded.StartNATS()
	if err != nil {
		t.Fatalf("testenv: private nats: %v", err)
	}
	t.Cleanup(ns.Stop)
	t.Logf("testenv: %s; a private in-process NATS server", kinds)
	return newEnv(t, ns.URL())
}

func newEnv(t testing.TB, natsURL string) *Env {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "t" + hex.EncodeToString(b[:])
	var (
		rdb    *redis.Client
		client redis.UniversalClient
	)
	if len(cluster) > 0 {
		client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster})
	} else {
		opt, err := redis.ParseURL(redisURL)
		if err != nil {
			t.Fatal(err)
		}
		rdb = redis.NewClient(opt)
		client = rdb
	}
	nc, err := nats.Connect(natsURL, nats.Name(t.Name()))
	if err != nil {
		t.Fatalf("testenv: nats: %v", err)
	}
	e := &Env{RedisURL: redisURL, NATSURL: natsURL, Prefix: prefix, Redis: rdb, Client: client,
		RedisCluster: cluster, NATS: nc}
	t.Cleanup(func() {
		if js, err := jetstream.New(nc); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			for _, k := range []string{"SUBMIT", "RESULT", "CANCEL"} {
				_ = js.DeleteStream(ctx, e.StreamPrefix()+"_"+k)
			}
			cancel()
		}
		nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		deleteMatching(ctx, client, prefix+":*")
		_ = client.Close()
	})
	return e
}

// deleteMatching deletes every key matching pattern, on every master of a
// cluster. Keys go one DEL each in a pipeline: a cluster refuses a DEL of
// keys in different slots.
func deleteMatching(ctx context.Context, c redis.UniversalClient, pattern string) {
	del := func(ctx context.Context, node redis.Cmdable) error {
		iter := node.Scan(ctx, 0, pattern, 1000).Iterator()
		var keys []string
		flush := func() {
			pipe := c.Pipeline()
			for _, k := range keys {
				pipe.Del(ctx, k)
			}
			_, _ = pipe.Exec(ctx)
			keys = keys[:0]
		}
		for iter.Next(ctx) {
			if keys = append(keys, iter.Val()); len(keys) == 500 {
				flush()
			}
		}
		if len(keys) > 0 {
			flush()
		}
		return iter.Err()
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return del(ctx, m) })
		return
	}
	_ = del(ctx, c)
}

// KeyPrefix is the test's Redis key prefix.
func (e *Env) KeyPrefix() string { return e.Prefix + ":" }

// RedisEmbedded reports whether the tests run against the embedded
// Redis-protocol store (no Redis reachable, or TROUPE_TEST_REDIS=embedded).
func (e *Env) RedisEmbedded() bool { return strings.Contains(kinds, "redis=embedded") }

// StreamPrefix is the test's JetStream stream prefix.
func (e *Env) StreamPrefix() string { return strings.ToUpper(e.Prefix) }
