package troupe_test

import (
	"context"
	"log/slog"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/testenv"
)

// infoLines is warnings at INFO: it passes each record at INFO or above
// whose message starts with prefix.
type infoLines struct{ *warnings }

func (h infoLines) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h infoLines) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h infoLines) WithGroup(string) slog.Handler                { return h }

// TestNodeAdvisesTheListpackValueAtStart: a node started on a Redis with
// the default hash-max-listpack-value (64) logs one INFO line naming the
// value and the advised one; on a Redis set to the advised value it says
// nothing.
func TestNodeAdvisesTheListpackValueAtStart(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	addr := startRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	for i, c := range []struct {
		set    string
		advice bool
	}{{"64", true}, {"1024", false}} {
		if err := rdb.ConfigSet(context.Background(), "hash-max-listpack-value", c.set).Err(); err != nil {
			t.Fatal(err)
		}
		lines := infoLines{&warnings{prefix: "Redis keeps job records in its hashtable encoding", got: make(chan map[string]string, 1)}}
		prefix := env.Prefix + strconv.Itoa(i)
		deleteStreamsAtCleanup(t, env, env.StreamPrefix()+strconv.Itoa(i))
		node, err := troupe.NewNode(troupe.Config{NodeID: "enc-" + strconv.Itoa(i), NATSURL: env.NATSURL, RedisURL: "redis://" + addr,
			KeyPrefix: prefix + ":", SubjectPrefix: prefix, StreamPrefix: env.StreamPrefix() + strconv.Itoa(i), Logger: slog.New(lines)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = node.Start(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		_ = node.Stop(context.Background())
		select {
		case attrs := <-lines.got:
			if !c.advice || attrs["hash_max_listpack_value"] != c.set || attrs["advised"] != "1024" {
				t.Fatalf("hash-max-listpack-value %s: advice %v", c.set, attrs)
			}
		default:
			if c.advice {
				t.Fatalf("hash-max-listpack-value %s: no advice", c.set)
			}
		}
	}
}

// startRedisServer starts a private redis-server on a free port (skipping
// the test where none is installed) and returns its address.
func startRedisServer(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed")
	}
	for attempt := 1; attempt <= 5; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		_ = l.Close()
		cmd := exec.Command(bin, "--port", strconv.Itoa(l.Addr().(*net.TCPAddr).Port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", t.TempDir())
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(&redis.Options{Addr: addr})
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if c.Ping(context.Background()).Err() == nil {
				_ = c.Close()
				t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
				return addr
			}
		}
		_ = c.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	t.Fatal("redis-server never answered on a free port in 5 attempts")
	return ""
}

// deleteStreamsAtCleanup deletes, when the test ends, the input streams of
// a stream prefix of the test's own other than the env's (which the env
// deletes itself): each reserves its MaxBytes of the shared JetStream's
// storage until deleted.
func deleteStreamsAtCleanup(t *testing.T, env *testenv.Env, streamPrefix string) {
	t.Cleanup(func() {
		js, err := jetstream.New(env.NATS)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, k := range []bus.StreamKind{bus.StreamSubmit, bus.StreamResult, bus.StreamCancel} {
			_ = js.DeleteStream(ctx, bus.StreamName(streamPrefix, k))
		}
	})
}
