package router

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/testenv"
)

func TestMappingStoreSeenByAnotherInstance(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	writer := NewMappingStore(env.Redis, env.KeyPrefix())
	reader := NewMappingStore(env.Redis, env.KeyPrefix()) // another replica

	if v, err := reader.Version(ctx); err != nil || v != 0 {
		t.Fatalf("version before any change = %d, %v", v, err)
	}
	if err := writer.Set(ctx, "job.new", "gpu", "gpu-b"); err != nil {
		t.Fatal(err)
	}
	m, err := reader.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != 1 || !reflect.DeepEqual(m.Topics, map[string][]string{"job.new": {"gpu", "gpu-b"}}) {
		t.Fatalf("reader sees %+v", m)
	}
	if err := writer.Delete(ctx, "job.new"); err != nil {
		t.Fatal(err)
	}
	if m, err = reader.Load(ctx); err != nil || m.Version != 2 || len(m.Topics) != 0 {
		t.Fatalf("after delete reader sees %+v, %v", m, err)
	}
}

func TestMappingStoreRejectsBadMappings(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	s := NewMappingStore(env.Redis, env.KeyPrefix())
	for _, c := range []struct {
		topic string
		pools []string
	}{{"", []string{"a"}}, {"job.a", nil}, {"job.a", []string{"a,b"}}, {"job.a", []string{""}}} {
		if err := s.Set(ctx, c.topic, c.pools...); !errors.Is(err, ErrInvalidMapping) {
			t.Errorf("Set(%q, %q) = %v, want ErrInvalidMapping", c.topic, c.pools, err)
		}
	}
}
