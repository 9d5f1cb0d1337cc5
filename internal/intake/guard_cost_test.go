package intake

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/embedded"
)

// fakeMsg is a JetStream message with given metadata whose Ack counts; the
// guard needs nothing else of a message.
type fakeMsg struct {
	jetstream.Msg
	md    jetstream.MsgMetadata
	acked *atomic.Int64
}

func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) { md := m.md; return &md, nil }
func (m *fakeMsg) Ack() error                                { m.acked.Add(1); return nil }

// privateRedis starts a redis-server of the test's own on a free loopback
// port (no persistence), so that its command counts are the test's alone;
// the test is skipped when redis-server is not on PATH.
func privateRedis(t *testing.T) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not on PATH")
	}
	dir := t.TempDir()
	for attempt := 0; attempt < 5; attempt++ {
		port, err := embedded.Port("127.0.0.1", 0)
		if err != nil {
			t.Fatal(err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
			"--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			select {
			case <-exited:
			default:
				if rdb.Ping(context.Background()).Err() != nil {
					continue
				}
				t.Cleanup(func() {
					_ = rdb.Close()
					_ = cmd.Process.Signal(os.Interrupt)
					select {
					case <-exited:
					case <-time.After(5 * time.Second):
						_ = cmd.Process.Kill()
						<-exited
					}
				})
				return rdb
			}
			break
		}
		_ = rdb.Close()
		_ = cmd.Process.Kill()
		<-exited
	}
	t.Fatal("redis-server never answered on a free port in 5 attempts")
	return nil
}

// dataCommands sums the calls of every command in INFO commandstats but the
// ones a client and this test use to connect and look (INFO, CONFIG, HELLO,
// CLIENT, PING).
func dataCommands(t *testing.T, rdb *redis.Client) (int64, map[string]int64) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]int64{}
	var total int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, _ := strconv.ParseInt(calls, 10, 64)
		switch {
		case name == "info", name == "ping", name == "hello", name == "select",
			strings.HasPrefix(name, "config"), strings.HasPrefix(name, "client"):
			continue
		}
		by[name] = n
		total += n
	}
	return total, by
}

// markCost marks n messages of two streams through a guard on rdb, at most
// perTick every tick (0: all at once). It returns the data commands the
// server ran for them, by command, and the largest number of commands the
// design allows for the run: per batch one HSET per bucket key (a batch
// lasts GuardLinger at least, unless full or cut short by Stop), per bucket
// key one EXPIRE.
func markCost(t *testing.T, rdb *redis.Client, n, perTick int, tick time.Duration) (total int64, by map[string]int64, bound int64) {
	t.Helper()
	if err := rdb.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	g := NewGuard(rdb, "cost:", nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	g.Start()
	var acked atomic.Int64
	var ticker *time.Ticker
	if perTick > 0 {
		ticker = time.NewTicker(tick)
		defer ticker.Stop()
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		if perTick > 0 && i > 0 && i%perTick == 0 {
			<-ticker.C
		}
		stream := "SUBMIT"
		if i%2 == 1 {
			stream = "RESULT"
		}
		m := &fakeMsg{md: jetstream.MsgMetadata{Stream: stream, Sequence: jetstream.SequencePair{Stream: uint64(i/2 + 1)},
			NumDelivered: 1, Timestamp: time.Now()}, acked: &acked}
		if err := g.Wrap(m).Ack(); err != nil {
			t.Fatal(err)
		}
	}
	g.Stop()
	end := time.Now()
	if got := acked.Load(); got != int64(n) {
		t.Fatalf("%d of %d messages acked", got, n)
	}
	total, by = dataCommands(t, rdb)
	const streams = 2
	buckets := int64(end.Unix()/int64(guardBucket/time.Second)-start.Unix()/int64(guardBucket/time.Second)) + 1
	// Batches: full ones, ones that lingered GuardLinger, the one Stop cut
	// short, the last of Stop's drain, and one more for rounding.
	batches := int64(n/guardBatch) + int64(end.Sub(start)/GuardLinger) + 3
	return total, by, streams*(batches+buckets) + streams*buckets
}

// The marks of a burst of 10,000 messages, and of a steady 2,000 messages/s
// (1,000 jobs/s: a submit and a result each), cost the server one HSET per
// batch and stream and one EXPIRE per bucket key, and no command per
// message. (One SET per message, 1.0 per mark, before the marks were
// bucketed.)
func TestGuardMarkCost(t *testing.T) {
	rdb := privateRedis(t)
	check := func(what string, n int, total int64, by map[string]int64, bound int64) {
		t.Helper()
		t.Logf("%s: %d marks, %d server commands, %.4f per mark %v (at most %d allowed)",
			what, n, total, float64(total)/float64(n), by, bound)
		if total > bound || by["set"] != 0 {
			t.Fatalf("%s: %d commands %v, more than the %d allowed", what, total, by, bound)
		}
	}
	const burst = 10_000
	total, by, bound := markCost(t, rdb, burst, 0, 0)
	check("burst", burst, total, by, min(bound, burst/100))

	const paced = 4_000
	total, by, bound = markCost(t, rdb, paced, 2, time.Millisecond)
	check("2 per ms", paced, total, by, bound)
}
