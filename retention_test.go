package troupe_test

import (
	"context"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/worker"
)

// Config.Tuning.Retention is how long a finished job's record (which holds its
// history) is kept: the expiry written when the job ends is the configured
// one, not the 24 h default; a negative retention keeps it.
func TestRetentionSetsHowLongFinishedJobsAreKept(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		retention time.Duration
		// min and max bound the record's TTL once the job ended (-1: none).
		min, max time.Duration
	}{
		{"90m", 90 * time.Minute, 80 * time.Minute, 90 * time.Minute},
		{"forever", -1, -1, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, func(cfg *troupe.Config) { cfg.Tuning.Retention = c.retention })
			f.startWorker("w1", true, nil, worker.Echo)
			f.submit(echoReq("kept-1"))
			f.waitState("kept-1", jobstate.StateSucceeded)
			keys := f.node.Store().Keys()
			for _, k := range []string{keys.Job("kept-1")} {
				ttl, err := f.env.Redis.PTTL(context.Background(), k).Result()
				if err != nil {
					t.Fatal(err)
				}
				if c.min < 0 {
					if ttl != -1 {
						t.Errorf("%s: TTL %s, want none (kept forever)", k, ttl)
					}
					continue
				}
				if ttl < c.min || ttl > c.max {
					t.Errorf("%s: TTL %s, want within [%s, %s] for Retention %s", k, ttl, c.min, c.max, c.retention)
				}
			}
		})
	}
}

// Config.Tuning.DLQRetention: the due poller drops DLQ entries older than it.
func TestDLQRetentionDropsOldEntries(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.DLQRetention = 300 * time.Millisecond
		c.Tuning.DuePoll = 20 * time.Millisecond
	})
	f.publishRaw(f.subj.Submit, []byte{0xff, 0xff, 0xff, 0x01})
	f.waitDLQ(func(e store.DLQEntry) bool { return e.Reason == jobstate.ReasonDecodeFailed })
	ctx := context.Background()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		es, err := f.node.Store().ListDLQ(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(es) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d DLQ entries still there 20 s after a 300 ms retention: %+v", len(es), es)
		}
	}
}
