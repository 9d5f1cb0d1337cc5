package router

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/testenv"
)

type watcherBundle struct {
	w         *PoolsWatcher
	path      string
	mappings  *MappingStore
	delivered chan *PoolConfig
}

func setupWatcher(t *testing.T, initial string, poll time.Duration) *watcherBundle {
	t.Helper()
	env := testenv.New(t)
	b := &watcherBundle{path: filepath.Join(t.TempDir(), "pools.yaml"),
		mappings: NewMappingStore(env.Redis, env.KeyPrefix()), delivered: make(chan *PoolConfig, 16)}
	b.write(t, initial)
	w, err := NewPoolsWatcher(PoolsWatcherConfig{Path: b.path, Mappings: NewMappingStore(env.Redis, env.KeyPrefix()),
		Poll: poll, Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	b.w = w
	t.Cleanup(w.Stop)
	return b
}

func (b *watcherBundle) write(t *testing.T, content string) {
	t.Helper()
	if err := os.WriteFile(b.path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// next waits for a delivered config that satisfies ok.
func (b *watcherBundle) next(t *testing.T, ok func(*PoolConfig) bool) *PoolConfig {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case cfg := <-b.delivered:
			if ok(cfg) {
				return cfg
			}
		case <-deadline:
			t.Fatal("no matching config delivered within 5 s")
			return nil
		}
	}
}

func TestPoolsWatcherReloadsOnDemand(t *testing.T) {
	t.Parallel()
	b := setupWatcher(t, "topics: {job.a: a}\n", time.Hour) // no polling: SIGHUP path only
	cfg, err := b.w.Load(context.Background())
	if err != nil || !reflect.DeepEqual(cfg.Topics["job.a"], []string{"a"}) {
		t.Fatalf("Load = %v, %v", cfg, err)
	}
	b.w.start(func(c *PoolConfig) { b.delivered <- c })

	b.write(t, "topics: {job.a: b}\n")
	if err := b.w.Reload(); err != nil {
		t.Fatal(err)
	}
	got := b.next(t, func(*PoolConfig) bool { return true })
	if !reflect.DeepEqual(got.Topics["job.a"], []string{"b"}) || b.w.Current() != got {
		t.Fatalf("delivered %v, want job.a → b", got.Topics)
	}
	// Nothing changed: nothing delivered.
	if err := b.w.Reload(); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-b.delivered:
		t.Fatalf("unchanged file delivered %v", c.Topics)
	default:
	}
}

func TestPoolsWatcherKeepsOldConfigOnInvalidFile(t *testing.T) {
	t.Parallel()
	b := setupWatcher(t, "topics: {job.a: a}\n", time.Hour)
	old, err := b.w.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b.w.start(func(c *PoolConfig) { b.delivered <- c })
	b.write(t, "topics:\n  job.a: a\npools:\n  a: {dispatch: sideways}\n")
	err = b.w.Reload()
	if !errors.Is(err, ErrInvalidPools) || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("Reload = %v, want an invalid-pools error naming line 4", err)
	}
	if b.w.Current() != old {
		t.Fatal("invalid file replaced the config")
	}
	select {
	case c := <-b.delivered:
		t.Fatalf("invalid file delivered %v", c.Topics)
	default:
	}
	// A missing file is kept out the same way.
	if err := os.Remove(b.path); err != nil {
		t.Fatal(err)
	}
	if err := b.w.Reload(); err == nil || b.w.Current() != old {
		t.Fatalf("missing file: err %v, config replaced %v", err, b.w.Current() != old)
	}
}

func TestPoolsWatcherPicksUpFileChangesByPolling(t *testing.T) {
	t.Parallel()
	b := setupWatcher(t, "topics: {job.a: a}\n", 20*time.Millisecond)
	if _, err := b.w.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.w.start(func(c *PoolConfig) { b.delivered <- c })
	b.write(t, "topics: {job.a: a, job.b: b}\n")
	b.next(t, func(c *PoolConfig) bool { return len(c.Topics["job.b"]) == 1 })
}

func TestPoolsWatcherMergesRuntimeMappingsFromAnotherReplica(t *testing.T) {
	t.Parallel()
	b := setupWatcher(t, "topics: {job.a: a, job.b: b}\n", 20*time.Millisecond)
	ctx := context.Background()
	if _, err := b.w.Load(ctx); err != nil {
		t.Fatal(err)
	}
	b.w.start(func(c *PoolConfig) { b.delivered <- c })

	// Another replica (its own MappingStore) maps a new topic and overrides one.
	if err := b.mappings.Set(ctx, "job.c", "c"); err != nil {
		t.Fatal(err)
	}
	if err := b.mappings.Set(ctx, "job.a", "fast"); err != nil {
		t.Fatal(err)
	}
	got := b.next(t, func(c *PoolConfig) bool { return len(c.Topics["job.c"]) == 1 && c.Topics["job.a"][0] == "fast" })
	if !reflect.DeepEqual(got.Topics["job.b"], []string{"b"}) {
		t.Fatalf("file mapping lost: %v", got.Topics)
	}
	// Deleting the runtime mapping restores the file's.
	if err := b.mappings.Delete(ctx, "job.a"); err != nil {
		t.Fatal(err)
	}
	b.next(t, func(c *PoolConfig) bool { return c.Topics["job.a"][0] == "a" })
}
