package bench

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/connect"
)

// redisCounter is a go-redis hook that counts what a client sends: every
// command, and every round trip (a single command is one, a whole pipeline is
// one). It is how the bench counts the node's round trips — Redis has no
// server-side pipeline counter. EVALSHA counts as one command here; the
// commands a script runs inside Redis show up only in INFO commandstats.
type redisCounter struct {
	mu         sync.Mutex // guards the fields below; one lock per command or pipeline
	commands   int64
	roundTrips int64
	byName     map[string]int64
}

func newRedisCounter() *redisCounter { return &redisCounter{byName: map[string]int64{}} }

// RedisCounts is a snapshot of a redisCounter.
type RedisCounts struct {
	Commands   int64            `json:"commands"`
	RoundTrips int64            `json:"round_trips"`
	ByName     map[string]int64 `json:"by_name,omitempty"`
}

func (c *redisCounter) snapshot() RedisCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return RedisCounts{Commands: c.commands, RoundTrips: c.roundTrips, ByName: maps.Clone(c.byName)}
}

func (c *redisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.commands++
		c.roundTrips++
		c.byName[cmd.Name()]++
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (c *redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		c.commands += int64(len(cmds))
		c.roundTrips++
		for _, cmd := range cmds {
			c.byName[cmd.Name()]++
		}
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

// sub returns a − b per field (b may be zero).
func (a RedisCounts) sub(b RedisCounts) RedisCounts {
	out := RedisCounts{Commands: a.Commands - b.Commands, RoundTrips: a.RoundTrips - b.RoundTrips,
		ByName: map[string]int64{}}
	for k, v := range a.ByName {
		if d := v - b.ByName[k]; d != 0 {
			out.ByName[k] = d
		}
	}
	return out
}

// newCountedClient builds a client for urls with a redisCounter attached:
// one address (redis://… or host:port) is one server, several separated by
// commas are the seeds of a Redis Cluster (as `troupe node --redis` takes
// them, internal/connect). The pool is go-redis's default, sized for the
// store writer's concurrent pipelines plus the renewer and readers. On a
// cluster the hook counts at the cluster client: a pipeline that spans
// masters counts as one round trip though it is one per master.
func newCountedClient(urls string) (redis.UniversalClient, *redisCounter, error) {
	rdb, err := connect.NewRedis(urls, connect.Redis{})
	if err != nil {
		return nil, nil, err
	}
	c := newRedisCounter()
	rdb.AddHook(c)
	return rdb, c, nil
}

// masterStats is INFO of one Redis server: a cluster's master, or the one
// server.
type masterStats struct {
	addr string
	serverStats
}

// readMasters reads INFO from every master of a cluster client (sorted by
// address), or from the one server of a plain client.
func readMasters(ctx context.Context, rdb redis.UniversalClient) []masterStats {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		addr := ""
		if c, ok := rdb.(*redis.Client); ok {
			addr = c.Options().Addr
		}
		return []masterStats{{addr: addr, serverStats: readServerStats(ctx, rdb)}}
	}
	var (
		mu  sync.Mutex
		out []masterStats
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		st := readServerStats(ctx, c)
		mu.Lock()
		out = append(out, masterStats{addr: c.Options().Addr, serverStats: st})
		mu.Unlock()
		return nil
	})
	if err != nil || len(out) == 0 {
		return []masterStats{{serverStats: serverStats{calls: map[string]int64{}}}}
	}
	slices.SortFunc(out, func(a, b masterStats) int { return strings.Compare(a.addr, b.addr) })
	return out
}

// sumServers adds the masters' readings into one: ok only when every master
// was read.
func sumServers(ms []masterStats) serverStats {
	sum := serverStats{ok: len(ms) > 0, calls: map[string]int64{}}
	for _, m := range ms {
		sum.ok = sum.ok && m.ok
		sum.cpuSec += m.cpuSec
		sum.reads += m.reads
		for k, v := range m.calls {
			sum.calls[k] += v
		}
		if sum.version == "" {
			sum.version = m.version
		}
	}
	return sum
}

// serverStats is what INFO tells about the whole Redis server. Another client
// of the same server (a test run on a shared machine) shows up in it too.
type serverStats struct {
	ok     bool
	calls  map[string]int64 // INFO commandstats: calls per command, including commands run inside scripts
	cpuSec float64          // INFO cpu: used_cpu_user + used_cpu_sys
	// reads is INFO stats total_reads_processed: the socket reads the
	// server's event loop made, about one per round trip a client makes.
	reads   int64
	version string
}

// readServerStats reads INFO; a server without these sections (the embedded
// store) yields ok=false and the report says the figure is unavailable.
func readServerStats(ctx context.Context, rdb redis.UniversalClient) serverStats {
	st := serverStats{calls: map[string]int64{}}
	txt, err := rdb.Info(ctx, "server", "cpu", "stats", "commandstats").Result()
	if err != nil {
		// Older servers (and miniredis) take one section at a time.
		if t, err2 := rdb.Info(ctx, "commandstats").Result(); err2 == nil {
			txt = t
		} else {
			return st
		}
	}
	parseInfo(txt, &st)
	st.ok = len(st.calls) > 0
	return st
}

func parseInfo(txt string, st *serverStats) {
	for line := range strings.SplitSeq(txt, "\n") {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(k, "cmdstat_"):
			// cmdstat_hset:calls=401,usec=1299,...
			for f := range strings.SplitSeq(v, ",") {
				if n, ok := strings.CutPrefix(f, "calls="); ok {
					c, _ := strconv.ParseInt(n, 10, 64)
					st.calls[strings.TrimPrefix(k, "cmdstat_")] = c
				}
			}
		case k == "used_cpu_user" || k == "used_cpu_sys":
			f, _ := strconv.ParseFloat(v, 64)
			st.cpuSec += f
		case k == "total_reads_processed":
			st.reads, _ = strconv.ParseInt(v, 10, 64)
		case k == "redis_version":
			st.version = v
		}
	}
}

// callsDelta returns after − before per command and the total.
func callsDelta(before, after serverStats) (map[string]int64, int64) {
	out := map[string]int64{}
	var total int64
	for k, v := range after.calls {
		if d := v - before.calls[k]; d > 0 {
			out[k] = d
			total += d
		}
	}
	return out, total
}
