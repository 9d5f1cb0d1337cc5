package policyx

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/testenv"
)

// Probes whose callers died never report; after a while the half-open
// circuit hands out new ones instead of staying shut for good. Both the
// Redis script and the in-process breaker.
func TestBreakerReissuesLostProbes(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	for name, b := range map[string]*breaker{
		"redis": newBreaker(BreakerConfig{}, env.Redis, env.KeyPrefix()+"breaker", time.Second, clock,
			slog.New(slog.DiscardHandler), func(BreakerState) {}),
		"local": newBreaker(BreakerConfig{}, nil, "", time.Second, clock, slog.New(slog.DiscardHandler), func(BreakerState) {}),
	} {
		ctx := context.Background()
		for i := 0; i < BreakerFailuresDefault; i++ {
			p, ok := b.acquire(ctx)
			if !ok {
				t.Fatalf("%s: closed circuit refused", name)
			}
			b.record(ctx, p, false)
		}
		if _, ok := b.acquire(ctx); ok {
			t.Fatalf("%s: open circuit let a call through", name)
		}
		now = now.Add(BreakerOpenDefault)
		for i := 0; i < BreakerProbesDefault; i++ {
			if _, ok := b.acquire(ctx); !ok {
				t.Fatalf("%s: probe %d refused", name, i)
			}
		}
		if _, ok := b.acquire(ctx); ok {
			t.Fatalf("%s: a fourth probe went through", name)
		}
		// The probes never report. Within the stale window: still shut.
		now = now.Add(b.probeStale - time.Millisecond)
		if _, ok := b.acquire(ctx); ok {
			t.Fatalf("%s: probes re-issued too early", name)
		}
		now = now.Add(time.Millisecond)
		p, ok := b.acquire(ctx)
		if !ok {
			t.Fatalf("%s: lost probes never re-issued", name)
		}
		b.record(ctx, p, true)
		p, _ = b.acquire(ctx)
		b.record(ctx, p, true)
		if s := b.state(ctx); s != BreakerClosed {
			t.Fatalf("%s: state %v after two successes", name, s)
		}
	}
}
