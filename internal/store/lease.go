package store

import (
	"context"
	"fmt"
	"github.com/troupe-run/troupe/internal/jobstate"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// NodeLease is a node's entry in the nodes set (Keys.Nodes).
type NodeLease struct {
	Node string
	// Renewed is the node's last lease renewal; zero for a node marked
	// dead (it stopped gracefully, or its adoption is under way).
	Renewed time.Time
	// Adopting: the due poller has started adopting its parked jobs.
	Adopting bool
}

// DeadNodes returns up to limit nodes whose lease was last renewed before
// before (so their alive keys, with a lock TTL, have expired), or that
// stopped gracefully.
func (s *Store) DeadNodes(ctx context.Context, before time.Time, limit int64) ([]NodeLease, error) {
	zs, err := s.rdb.ZRangeByScoreWithScores(ctx, s.keys.Nodes(), &redis.ZRangeBy{Min: "-inf",
		Max: "(" + strconv.FormatInt(before.UnixMilli(), 10), Count: limit}).Result()
	if err != nil {
		return nil, fmt.Errorf("store: dead nodes: %w", err)
	}
	out := make([]NodeLease, 0, len(zs))
	for _, z := range zs {
		id, _ := z.Member.(string)
		l := NodeLease{Node: id, Adopting: z.Score == leaseAdoptingScore}
		if z.Score > leaseDeadScore {
			l.Renewed = time.UnixMilli(int64(z.Score))
		}
		out = append(out, l)
	}
	return out, nil
}

// StartAdoption prepares the adoption of a dead node's parked jobs: every
// member's score (its due time) becomes 0, so each is offered at once (and
// then again only DueRetryAfter later if it was not adopted), and the node
// is marked as being adopted. It does nothing if the node renewed its lease
// since before. Reports whether the node is now being adopted.
func (s *Store) StartAdoption(ctx context.Context, node string, before time.Time) (bool, error) {
	still, err := s.rdb.ZScore(ctx, s.keys.Nodes(), node).Result()
	if err != nil || still >= float64(before.UnixMilli()) {
		return false, ignoreNil(err)
	}
	// Items 0 to Shards-1 rescore the parked sets; item Shards marks the
	// node. Only the mark is a script, so only it is sent again after a
	// NOSCRIPT.
	items, err := s.sendScripts(ctx, Shards+1, func(pipe redis.Pipeliner, i int) []redis.Cmder {
		if i < Shards {
			k := s.keys.Parked(i, node)
			return []redis.Cmder{pipe.ZUnionStore(ctx, k, &redis.ZStore{Keys: []string{k}, Weights: []float64{0}})}
		}
		return []redis.Cmder{evalSha(ctx, pipe, deadNodeCall{nodesKey: s.keys.Nodes(), node: node,
			beforeMs: before.UnixMilli(), mark: strconv.Itoa(leaseAdoptingScore)})}
	})
	if err != nil {
		return false, err
	}
	for _, it := range items {
		if err := it.cmds[0].Err(); err != nil {
			return false, fmt.Errorf("store: start adoption of %s: %w", node, err)
		}
	}
	mark := items[Shards].cmds[0].(*redis.Cmd)
	n, _ := mark.Int64()
	return n == 1, nil
}

// ForgetNode removes a dead node with no parked jobs left from the nodes
// set, unless it renewed its lease since before.
func (s *Store) ForgetNode(ctx context.Context, node string, before time.Time) error {
	err := runScript(ctx, s.rdb, deadNodeCall{nodesKey: s.keys.Nodes(), node: node, beforeMs: before.UnixMilli(),
		mark: "forget"}).Err()
	if err != nil {
		return fmt.Errorf("store: forget node %s: %w", node, err)
	}
	return nil
}

// ParkedDispatched calls fn with pages of the jobs node has parked that are
// still DISPATCHED (a node restarted under the same id learns them again:
// their worker's progress and eviction must wake them).
func (s *Store) ParkedDispatched(ctx context.Context, node string, fn func(ids []string)) error {
	return s.ParkedIn(ctx, node, fn, jobstate.StateDispatched)
}

// ParkedIn calls fn with pages of the jobs node has parked whose state is
// one of states. Each page is one ZSCAN and one pipeline of HGETs.
func (s *Store) ParkedIn(ctx context.Context, node string, fn func(ids []string), states ...jobstate.State) error {
	for shard := 0; shard < Shards; shard++ {
		var cursor uint64
		for {
			kv, next, err := s.rdb.ZScan(ctx, s.keys.Parked(shard, node), cursor, "", 1000).Result()
			if err != nil {
				return fmt.Errorf("store: parked jobs of %s: %w", node, err)
			}
			ids := make([]string, 0, len(kv)/2)
			for i := 0; i+1 < len(kv); i += 2 {
				ids = append(ids, kv[i])
			}
			if len(ids) > 0 {
				pipe := s.rdb.Pipeline()
				got := make([]*redis.StringCmd, len(ids))
				for i, id := range ids {
					got[i] = pipe.HGet(ctx, s.keys.Job(id), "s")
				}
				_, _ = pipe.Exec(ctx)
				kept := ids[:0]
				for i, id := range ids {
					if slices.Contains(states, jobstate.State(got[i].Val())) {
						kept = append(kept, id)
					}
				}
				if len(kept) > 0 {
					fn(kept)
				}
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return nil
}

// ParkedDue returns, over every shard, up to perShard jobs node has parked
// whose score (due time) is at or before cutoff, and moves each to next, so a
// job is offered again only if nobody acts on it. One pipeline.
func (s *Store) ParkedDue(ctx context.Context, node string, cutoff, next time.Time, perShard int) ([]string, error) {
	return s.popDue(ctx, func(shard int) string { return s.keys.Parked(shard, node) }, cutoff, next, perShard)
}

// ParkedCount returns how many jobs node has parked (one pipeline of ZCARDs).
func (s *Store) ParkedCount(ctx context.Context, node string) (int64, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, Shards)
	for i := range cmds {
		cmds[i] = pipe.ZCard(ctx, s.keys.Parked(i, node))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("store: parked count: %w", err)
	}
	var n int64
	for _, c := range cmds {
		n += c.Val()
	}
	return n, nil
}

// NeverDue is the parked score of a job with no deadline: far beyond any
// real time, but exact in a float64 score.
const NeverDue = int64(1) << 52

func parkDue(ms int64) int64 {
	if ms <= 0 || ms > NeverDue {
		return NeverDue
	}
	return ms
}

func ignoreNil(err error) error {
	if err == redis.Nil {
		return nil
	}
	return err
}
