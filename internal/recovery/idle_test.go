package recovery

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// wakes is an Intake that passes every woken job id to a channel.
type wakes chan string

func (w wakes) Wake(id string)                    { w <- id }
func (w wakes) WakeOrphan(id string, _ time.Time) { w <- id }
func (w wakes) RememberParked(ids []string)       {}
func (w wakes) next(t *testing.T, within time.Duration) (string, time.Duration) {
	t.Helper()
	start := time.Now()
	select {
	case id := <-w:
		return id, time.Since(start)
	case <-time.After(within):
		t.Fatalf("no job woken within %v", within)
		return "", 0
	}
}

// waitInterval waits (up to within) until the running poller's interval
// is want, or (below) under want.
func waitInterval(t *testing.T, p *DuePoller, want time.Duration, below bool, within time.Duration) {
	t.Helper()
	ok := func(d time.Duration) bool { return d == want && !below || below && d < want }
	for deadline := time.Now().Add(within); !ok(p.Interval()); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("poller interval %v after %v, want %v (under it: %v)", p.Interval(), within, want, below)
		}
	}
}

// An idle poller backs off to IdleEvery, and a due time written meanwhile
// by anyone (here straight into the due set, as another replica's script
// does) is still woken within Slack + IdleEvery of its due time; a Poke
// brings the interval back down.
func TestIdlePollerBacksOffAndStillWakesWhatAnotherNodeMadeDue(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	if env.Redis == nil {
		t.Skip("needs a single Redis")
	}
	ctx := context.Background()
	st := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	if err := st.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	const every, idle, slack = 20 * time.Millisecond, 320 * time.Millisecond, 50 * time.Millisecond
	woken := make(wakes, 16)
	p := &DuePoller{Store: st, Intake: woken, NodeID: "idle-a", Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Every: every, IdleEvery: idle, Slack: slack}
	p.Start()
	t.Cleanup(p.Stop)
	waitInterval(t, p, idle, false, 10*time.Second)

	for i, id := range []string{"job-idle-1", "job-idle-2", "job-idle-3"} {
		waitInterval(t, p, idle, false, 10*time.Second)
		due := time.Now()
		if err := env.Redis.ZAdd(ctx, st.Keys().Due(store.Shard(id)), redis.Z{Score: float64(due.UnixMilli()), Member: id}).Err(); err != nil {
			t.Fatal(err)
		}
		got, _ := woken.next(t, 10*time.Second)
		late := time.Since(due)
		if got != id {
			t.Fatalf("woke %q, want %q", got, id)
		}
		// The promise: DueSlack + IdleEvery; a tick's own time and a
		// loaded machine get a generous margin, still far below what
		// a lost entry (never) or a lapsed poller lock would show.
		if bound := slack + idle + 500*time.Millisecond; late > bound {
			t.Fatalf("wake %d came %v after its due time, want within %v", i, late, bound)
		}
		t.Logf("wake %d: %v after its due time (slack %v, idle interval %v)", i, late, slack, idle)
		// The tick that woke it brings the interval back to Every (its
		// return follows the wake), doubling from there: seen while it
		// is under idle (the 300 ms of the 20, 40, 80 and 160 ms ticks).
		waitInterval(t, p, idle, true, 10*time.Second)
		// Not offered again DueRetryAfter later.
		if err := env.Redis.ZRem(ctx, st.Keys().Due(store.Shard(id)), id).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// A Poke does the same.
	waitInterval(t, p, idle, false, 10*time.Second)
	p.Poke()
	waitInterval(t, p, idle, true, time.Second)
}
