package store_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// TestPlainCommandsRedisCPUBound measures, on one private redis-server, what
// a job's happy path costs Redis through the store's scripts (the writer,
// several jobs a call) and what the same keys and writes cost as plain
// commands: per batch of jobs, a WATCH of the keys the scripts check and
// their reads (EXISTS of record, lock and cancel mark for a create; GET of
// the lock and HMGET of the record for a finish), then one MULTI/EXEC with
// the writes the scripts make (HSET, ZADD index, SET lock, ZADD due and
// lease; HSET, ZREM + ZADD index, ZREM due and lease, DEL lock). It is a
// bound for a design that checks with WATCH instead of Lua, not that design:
// the plain path computes nothing (the hop fields are given, as the node
// would format them) and takes no decision on what it read. Rounds
// alternate the two, TROUPE_REDIS_BOUND_JOBS jobs each
// (TROUPE_REDIS_BOUND_ROUNDS rounds, 3 by default).
func TestPlainCommandsRedisCPUBound(t *testing.T) {
	jobs, _ := strconv.Atoi(os.Getenv("TROUPE_REDIS_BOUND_JOBS"))
	if jobs <= 0 {
		t.Skip("TROUPE_REDIS_BOUND_JOBS not set")
	}
	rounds, _ := strconv.Atoi(os.Getenv("TROUPE_REDIS_BOUND_ROUNDS"))
	if rounds <= 0 {
		rounds = 3
	}
	batch, _ := strconv.Atoi(os.Getenv("TROUPE_REDIS_BOUND_BATCH"))
	if batch <= 0 {
		batch = 20
	}
	rdb := privateRedis(t)
	ctx := context.Background()
	s := store.New(rdb, store.Config{Prefix: "cpu:", LockTTL: time.Minute})
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	w := s.NewWriter(0, 0, 0)
	t.Cleanup(w.Close)
	keys := s.Keys()
	const inFlight = 256

	scripts := func(prefix string, n int) { runHappyPath(t, w, prefix, n, 0) }

	// plain runs the same writes as plain commands, batch jobs at a time
	// (each batch a create phase and then a finish phase, as the scripts'
	// calls group jobs), inFlight/batch batches at once.
	plain := func(prefix string, n int) {
		var wg sync.WaitGroup
		starts := make(chan int)
		for g := 0; g < max(inFlight/batch, 1); g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for first := range starts {
					ids := make([]string, 0, batch)
					for i := first; i < min(first+batch, n); i++ {
						ids = append(ids, prefix+strconv.Itoa(i))
					}
					if err := plainBatch(ctx, rdb, keys, ids); err != nil {
						t.Error(err)
						for range starts { // the rest unrun, the sender not left waiting
						}
						return
					}
				}
			}()
		}
		for i := 0; i < n; i += batch {
			starts <- i
		}
		close(starts)
		wg.Wait()
	}

	scripts("warm-s-", jobs/10)
	plain("warm-p-", jobs/10)
	var sum [2]float64
	for round := 0; round < rounds; round++ {
		for k, way := range []func(string, int){scripts, plain} {
			prefix := []string{"s", "p"}[k] + strconv.Itoa(round) + "-"
			cpu0 := redisCPU(t, rdb)
			way(prefix, jobs)
			us := (redisCPU(t, rdb) - cpu0) / float64(jobs) * 1e6
			sum[k] += us
			t.Logf("round %d %s: redis CPU %.1f µs per job", round, []string{"scripts", "plain"}[k], us)
		}
	}
	t.Logf("mean over %d rounds of %d jobs (batches of %d): scripts %.1f, plain %.1f µs per job",
		rounds, jobs, batch, sum[0]/float64(rounds), sum[1]/float64(rounds))
}

// plainLeaveOut names parts of the plain path left out, to see what each
// costs (TROUPE_REDIS_BOUND_LEAVE_OUT, comma-separated): watch (no WATCH
// and no reads), index (no state index entries), lock (no lock key), due
// (no due or lease entries), fields (the create writes s, req, pd and the
// hops only; the finish s, hops and result_ptr).
var plainLeaveOut = func() map[string]bool {
	m := map[string]bool{}
	for _, f := range strings.Split(os.Getenv("TROUPE_REDIS_BOUND_LEAVE_OUT"), ",") {
		if f != "" {
			m[f] = true
		}
	}
	return m
}()

func plainBatch(ctx context.Context, rdb *redis.Client, keys *store.Keys, ids []string) error {
	if plainLeaveOut["watch"] {
		return plainWrites(ctx, rdb, keys, ids)
	}
	watched := make([]string, 0, 3*len(ids))
	for _, id := range ids {
		watched = append(watched, keys.Job(id), keys.Lock(id), keys.CancelMark(id))
	}
	// The create: WATCH what the script's EXISTS checks, check, then write.
	err := rdb.Watch(ctx, func(tx *redis.Tx) error {
		pipe := tx.Pipeline()
		for _, id := range ids {
			pipe.Exists(ctx, keys.Job(id), keys.Lock(id), keys.CancelMark(id))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error { plainCreates(ctx, p, keys, ids); return nil })
		return err
	}, watched...)
	if err != nil {
		return err
	}
	// The finish: WATCH the lock and record, read them, then write.
	watched = watched[:0]
	for _, id := range ids {
		watched = append(watched, keys.Lock(id), keys.Job(id))
	}
	return rdb.Watch(ctx, func(tx *redis.Tx) error {
		pipe := tx.Pipeline()
		for _, id := range ids {
			pipe.Get(ctx, keys.Lock(id))
			pipe.HMGet(ctx, keys.Job(id), "s", "hn", "created", "hl", "h1")
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error { plainFinishes(ctx, p, keys, ids); return nil })
		return err
	}, watched...)
}

// plainWrites is the plain path's writes alone, in one MULTI/EXEC for the
// creates and one for the finishes.
func plainWrites(ctx context.Context, rdb *redis.Client, keys *store.Keys, ids []string) error {
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error { plainCreates(ctx, p, keys, ids); return nil }); err != nil {
		return err
	}
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error { plainFinishes(ctx, p, keys, ids); return nil })
	return err
}

func plainCreates(ctx context.Context, p redis.Pipeliner, keys *store.Keys, ids []string) {
	now := time.Now().UnixMilli()
	nowS := strconv.FormatInt(now, 10)
	dl := strconv.FormatInt(now+9_000_000, 10)
	for _, id := range ids {
		pd := "topic:9:job.benchtenant:7:defaulttrace:" + strconv.Itoa(len(id)) + ":" + id +
			"policy_decision:5:allowpolicy_reason:16:allow-all policyrule_id:16:troupe:allow-allpolicy_snapshot:9:allow-all"
		req := "\n\x0f" + id + "\x12\tjob.bench\"\x1bredis://ctx:" + id
		if plainLeaveOut["fields"] {
			p.HSet(ctx, keys.Job(id), "s", "DISPATCHED", "req", req, "h1", "0|PENDING|submitted|bench-node",
				"h2", "0|SCHEDULED|policy_allowed|", "h3", "0|DISPATCHED|dispatched|", "pd", pd)
		} else {
			p.HSet(ctx, keys.Job(id), "s", "DISPATCHED", "req", req,
				"created", nowS, "reason", "dispatched", "h1", "0|PENDING|submitted|bench-node",
				"h2", "0|SCHEDULED|policy_allowed|", "h3", "0|DISPATCHED|dispatched|", "hn", "3", "worker", "bw4",
				"subj", "bench-node.worker.bw4.jobs", "attempts", "1", "deadline", dl, "deadline_kind", "running_timeout",
				"sod", "1", "pool", "bench", "pd", pd, "op", "10qb36hj69zb6")
		}
		if !plainLeaveOut["index"] {
			p.ZAdd(ctx, keys.Index(store.Shard(id), string(jobstate.StateDispatched)), redis.Z{Score: float64(now), Member: id})
		}
		if !plainLeaveOut["lock"] {
			p.Set(ctx, keys.Lock(id), "bench-node|1", time.Minute)
		}
		if !plainLeaveOut["due"] {
			p.ZAdd(ctx, keys.Due(store.Shard(id)), redis.Z{Score: float64(now + 9_000_000), Member: id},
				redis.Z{Score: float64(now + 120_000), Member: "|" + id})
		}
	}
}

func plainFinishes(ctx context.Context, p redis.Pipeliner, keys *store.Keys, ids []string) {
	now := time.Now().UnixMilli()
	nowS := strconv.FormatInt(now, 10)
	for _, id := range ids {
		if plainLeaveOut["fields"] {
			p.HSet(ctx, keys.Job(id), "s", "SUCCEEDED", "h4", "2|RUNNING|worker_started|",
				"h5", "2|SUCCEEDED|worker_completed|", "result_ptr", "redis://res:"+id)
		} else {
			p.HSet(ctx, keys.Job(id), "s", "SUCCEEDED", "updated", nowS, "reason", "worker_completed",
				"h4", "2|RUNNING|worker_started|", "h5", "2|SUCCEEDED|worker_completed|", "hn", "5",
				"result_ptr", "redis://res:"+id, "worker", "bw4", "execution_ms", "0", "op", "3llbv2k2zgyx7")
		}
		if !plainLeaveOut["index"] {
			p.ZRem(ctx, keys.Index(store.Shard(id), string(jobstate.StateDispatched)), id)
		}
		p.ZAdd(ctx, keys.Index(store.Shard(id), string(jobstate.StateSucceeded)), redis.Z{Score: float64(now), Member: id})
		if !plainLeaveOut["due"] {
			p.ZRem(ctx, keys.Due(store.Shard(id)), id, "|"+id)
		}
		if !plainLeaveOut["lock"] {
			p.Del(ctx, keys.Lock(id))
		}
	}
}
