package troupe_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/worker"
)

// Config.Tuning.Retention is how long a finished job's record (which holds its
// history) is kept: the record carries no expiry of its own, and the due
// poller's housekeeping deletes it once the configured retention has passed
// since the job ended; a negative retention keeps it (no expiry, no trim).
func TestRetentionSetsHowLongFinishedJobsAreKept(t *testing.T) {
	t.Parallel()
	t.Run("300ms", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, func(cfg *troupe.Config) {
			cfg.Tuning.Retention = 300 * time.Millisecond
			cfg.Tuning.DuePoll = 20 * time.Millisecond
		})
		f.startWorker("w1", true, nil, worker.Echo)
		f.submit(echoReq("kept-1"))
		f.waitState("kept-1", jobstate.StateSucceeded)
		ctx := context.Background()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			_, err := f.node.Store().GetJob(ctx, "kept-1")
			if errors.Is(err, store.ErrNotFound) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatal("kept-1's record still there 20 s after it ended, with a 300 ms retention")
			}
		}
	})
	t.Run("forever", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, func(cfg *troupe.Config) { cfg.Tuning.Retention = -1 })
		f.startWorker("w1", true, nil, worker.Echo)
		f.submit(echoReq("kept-1"))
		f.waitState("kept-1", jobstate.StateSucceeded)
		k := f.node.Store().Keys().Job("kept-1")
		if ttl, err := f.env.Redis.PTTL(context.Background(), k).Result(); err != nil || ttl != -1 {
			t.Errorf("%s: TTL %s (%v), want none (kept forever)", k, ttl, err)
		}
	})
}

// Config.Tuning.DLQRetention: the due poller drops DLQ entries older than it.
// The test waits for the poller's own report of the drop (its log line,
// with the count): polling for the entry first raced the 300 ms retention
// on a loaded machine, where the entry could come and go between two polls.
func TestDLQRetentionDropsOldEntries(t *testing.T) {
	t.Parallel()
	dropped := make(chan int64, 16)
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.DLQRetention = 300 * time.Millisecond
		c.Tuning.DuePoll = 20 * time.Millisecond
		c.Logger = slog.New(&logWatch{msg: "dlq entries past their retention dropped", key: "count", got: dropped})
	})
	f.publishRaw(f.subj.Submit, []byte{0xff, 0xff, 0xff, 0x01})
	select {
	case n := <-dropped:
		if n != 1 {
			t.Fatalf("the due poller dropped %d DLQ entries, want the decode_failed one", n)
		}
	case <-time.After(time.Minute):
		// The drop comes with housekeeping, every recovery.TrimEvery (30)
		// due ticks, each of which may take its 1 s budget on a loaded
		// embedded store: 20 s was not enough at load ~15 with -race.
		t.Fatal("no DLQ entry dropped a minute after a 300 ms retention")
	}
	es, err := f.node.Store().ListDLQ(context.Background(), 10)
	if err != nil || len(es) != 0 {
		t.Fatalf("DLQ after the drop: %+v (%v), want empty", es, err)
	}
}

// logWatch is a slog.Handler that passes the int attribute key of each
// record with message msg to got (without blocking) and drops the rest.
type logWatch struct {
	msg, key string
	got      chan<- int64
}

func (h *logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (h *logWatch) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logWatch) WithGroup(string) slog.Handler            { return h }

func (h *logWatch) Handle(_ context.Context, r slog.Record) error {
	if r.Message != h.msg {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != h.key {
			return true
		}
		select {
		case h.got <- a.Value.Int64():
		default:
		}
		return false
	})
	return nil
}
