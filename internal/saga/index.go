package saga

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/store"
)

// The saga index: each shard's sorted set "<shard tag>saga:index" holds the
// workflows with a step recorded or a rollback triggered in that shard,
// scored by the time of the latest one. It is written in the same atomic
// job write as the stack entry or the trigger (RecordStep, RecordTrigger),
// trimmed of entries older than the retention on each write and expires
// with them, so it lists the workflows whose sagas are still kept. Listing
// merges the shards' indexes newest first.
const IndexSuffix = "saga:index"

// indexAdd is the index entry of a workflow's write at nowMs.
func indexAdd(workflowID string, nowMs int64, ttl time.Duration) store.ShardZAdd {
	return store.ShardZAdd{Suffix: IndexSuffix, Score: nowMs, Member: workflowID,
		TrimBelow: nowMs - ttl.Milliseconds(), TTL: ttl}
}

// IndexKey is one shard's saga index.
func IndexKey(k *store.Keys, shard int) string { return k.ShardTag(shard) + IndexSuffix }

// Listed is one workflow of a saga listing.
type Listed struct {
	WorkflowID string
	// Updated is when its latest step was recorded or rollback triggered.
	Updated time.Time
}

// ListPageMax caps one page of List.
const ListPageMax = 200

// List returns up to limit workflows of the saga index, newest first, from
// cursor on ("" from the newest; the cursor is "<score>:<workflow id>"),
// and the next page's cursor ("" after the last). Two pipelines: a
// ZREVRANGEBYSCORE of limit+1 entries per shard, then a ZSCORE per shard of
// each workflow read (up to Shards × (limit+1) of them).
func List(ctx context.Context, st *store.Store, limit int, cursor string) ([]Listed, string, error) {
	if limit <= 0 || limit > ListPageMax {
		limit = min(max(limit, 50), ListPageMax)
	}
	hi, afterID := "+inf", ""
	var hiScore int64
	if cursor != "" {
		s, id, ok := strings.Cut(cursor, ":")
		n, err := strconv.ParseInt(s, 10, 64)
		if !ok || err != nil || id == "" {
			return nil, "", store.ErrBadCursor
		}
		hi, hiScore, afterID = s, n, id
	}
	rdb, keys := st.Client(), st.Keys()
	pipe := rdb.Pipeline()
	cmds := make([]*redis.ZSliceCmd, store.Shards)
	for i := range cmds {
		// Entries tied with the cursor's score are fetched again and
		// skipped by id; a tie of more than limit entries in one
		// millisecond is not expected of workflows.
		cmds[i] = pipe.ZRevRangeByScoreWithScores(ctx, IndexKey(keys, i),
			&redis.ZRangeBy{Max: hi, Min: "-inf", Count: int64(limit + 1)})
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, "", fmt.Errorf("saga: list: %w", err)
	}
	var all []Listed
	more := false
	for _, c := range cmds {
		zs := c.Val()
		more = more || len(zs) > limit
		for _, z := range zs {
			id, _ := z.Member.(string)
			sc := int64(z.Score)
			if cursor == "" || sc < hiScore || id < afterID {
				all = append(all, Listed{WorkflowID: id, Updated: time.UnixMilli(sc)})
			}
		}
	}
	sort.Slice(all, func(i, j int) bool { return listedBefore(all[i], all[j]) })
	// A workflow with steps in several shards is in several indexes: only
	// its newest entry lists it, so it shows once across the pages.
	newest, err := newestEntries(ctx, st, all)
	if err != nil {
		return nil, "", err
	}
	out := make([]Listed, 0, limit)
	for i, l := range all {
		if newest[l.WorkflowID] != l.Updated.UnixMilli() {
			continue
		}
		out = append(out, l)
		if len(out) == limit {
			if more || i+1 < len(all) {
				return out, strconv.FormatInt(l.Updated.UnixMilli(), 10) + ":" + l.WorkflowID, nil
			}
			break
		}
	}
	return out, "", nil
}

// newestEntries returns each listed workflow's newest index score over
// every shard, in one pipeline of ZSCOREs.
func newestEntries(ctx context.Context, st *store.Store, ls []Listed) (map[string]int64, error) {
	ids := map[string]bool{}
	for _, l := range ls {
		ids[l.WorkflowID] = true
	}
	if len(ids) == 0 {
		return nil, nil
	}
	pipe := st.Client().Pipeline()
	cmds := map[string][]*redis.FloatCmd{}
	for id := range ids {
		cs := make([]*redis.FloatCmd, store.Shards)
		for i := range cs {
			cs[i] = pipe.ZScore(ctx, IndexKey(st.Keys(), i), id)
		}
		cmds[id] = cs
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("saga: list: %w", err)
	}
	out := make(map[string]int64, len(ids))
	for id, cs := range cmds {
		for _, c := range cs {
			if v, err := c.Result(); err == nil && int64(v) > out[id] {
				out[id] = int64(v)
			}
		}
	}
	return out, nil
}

func listedBefore(a, b Listed) bool {
	if !a.Updated.Equal(b.Updated) {
		return a.Updated.After(b.Updated)
	}
	return a.WorkflowID > b.WorkflowID
}
