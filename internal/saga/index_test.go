package saga

import (
	"context"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// TestListPagesTheIndexNewestFirstOnce: List merges the shards' indexes
// newest first, pages with its cursor (ties in one millisecond included),
// and lists a workflow indexed in several shards once, at its newest.
func TestListPagesTheIndexNewestFirstOnce(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	st := store.New(env.Redis, store.Config{Prefix: env.KeyPrefix()})
	ctx := context.Background()
	add := func(shard int, wf string, ms int64) {
		if err := env.Redis.ZAdd(ctx, IndexKey(st.Keys(), shard), redis.Z{Score: float64(ms), Member: wf}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	add(0, "wf-a", 100)
	add(1, "wf-b", 300)
	add(2, "wf-c", 300) // tied with wf-b
	add(3, "wf-d", 50)
	add(4, "wf-a", 400) // wf-a's newest step, in another shard
	add(5, "wf-e", 200)
	var got []string
	cursor := ""
	for page := 0; page < 10; page++ {
		ls, next, err := List(ctx, st, 2, cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			got = append(got, l.WorkflowID)
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	if want := []string{"wf-a", "wf-c", "wf-b", "wf-e", "wf-d"}; !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	if _, _, err := List(ctx, st, 2, "not-a-cursor"); err == nil {
		t.Fatal("a bad cursor was accepted")
	}
}
