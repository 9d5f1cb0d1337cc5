package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/store"
)

// afterPipelineHook calls after once for each pipeline that held an
// EVALSHA, after Redis answered it.
type afterPipelineHook struct {
	mu    sync.Mutex
	after func(n int) // n counts those pipelines, from 1
	n     int
}

func (h *afterPipelineHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *afterPipelineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *afterPipelineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if c.Name() == "evalsha" {
				h.mu.Lock()
				h.n++
				if h.after != nil {
					h.after(h.n)
				}
				h.mu.Unlock()
				break
			}
		}
		return err
	}
}

// parkAs parks id's lock as node's (fence 1), node's lease gone: node is
// dead. It runs inside a hook, on the writer's goroutine, so it reports
// failures with t.Error.
func parkAs(t *testing.T, rdb redis.UniversalClient, keys *store.Keys, id, node string) {
	ctx := context.Background()
	if err := rdb.Set(ctx, keys.Lock(id), node+"|1|p", 0).Err(); err != nil {
		t.Error(err)
	}
	if err := rdb.ZAdd(ctx, keys.Parked(store.Shard(id), node), redis.Z{Score: 1, Member: id}).Err(); err != nil {
		t.Error(err)
	}
}

// TestActivationNamesTheNodeThatParkedTheLock: the activation script learns
// which node parked a lock only when it reads it, and is sent again with
// that node's alive key and parked set; when the lock changes hands in
// between, it follows, within its bound.
func TestActivationNamesTheNodeThatParkedTheLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rdb, keys := b.s.Client(), b.s.Keys()
	deadline := b.dispatch(t, "pb1", "a")
	if r := b.park(t, "pb1", "a", 1, deadline); !r.Parked {
		t.Fatalf("park: %+v", r)
	}
	sh := store.Shard("pb1")
	rdb.Del(ctx, keys.Alive(sh, "a")) // a dies

	// Between the first send (which names b, the activating node, and
	// finds a's lock) and the second (which names a), node c takes the
	// job and parks it, and dies too: the third send names c and adopts.
	hook := &afterPipelineHook{}
	hook.after = func(n int) {
		if n == 1 {
			parkAs(t, rdb, keys, "pb1", "c")
			rdb.ZRem(ctx, keys.Parked(sh, "a"), "pb1")
		}
	}
	rdb.AddHook(hook)
	r := b.activate(t, "pb1", "b", false)
	if r.Status != store.ActivateAdopted || r.Holder != "c|1|p" || hook.n != 3 {
		t.Fatalf("activation of a lock that changed hands once: %+v after %d sends", r, hook.n)
	}
	if n := rdb.ZCard(ctx, keys.Parked(sh, "c")).Val(); n != 0 {
		t.Fatalf("adopted job left in c's parked set")
	}
	if due, _ := b.s.DueAt(ctx, "pb1"); due.UnixMilli() != deadline.UnixMilli() {
		t.Fatalf("deadline not back in the due set: %v", due)
	}

	// A lock that changes hands before every send: the activation ends in
	// an error, and changed nothing.
	rdb.Set(ctx, keys.Lock("pb1"), "d0|1|p", 0)
	hook.mu.Lock()
	hook.n = 0
	hook.after = func(n int) { parkAs(t, rdb, keys, "pb1", fmt.Sprintf("d%d", n)) }
	hook.mu.Unlock()
	done := make(chan *store.Result, 1)
	b.w.Submit(&store.Op{Kind: store.OpActivate, JobID: "pb1", Node: "b", Done: func(r *store.Result) { done <- r }})
	select {
	case r := <-done:
		if r.Err == nil || !strings.Contains(r.Err.Error(), "parked") {
			t.Fatalf("activation of a lock that kept changing hands: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("activation timed out")
	}
	if rec, err := b.s.GetJob(ctx, "pb1"); err != nil || rec.Fence != 2 {
		t.Fatalf("job after the failed activation: %+v %v", rec, err)
	}
}
