package troupe_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
)

// A node stopping while Redis is gone cannot release the locks of its jobs
// in flight: each stays until its TTL runs out, and no other replica adopts
// the job before. The node says so, naming the job (the release's outcome is
// otherwise waited for by nobody).
func TestStopWithRedisGoneSaysTheLockIsLeftToExpire(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	f := privateRedisFixture(t, func(c *troupe.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	const id = "job-stop-redis-gone"
	f.submit(echoReq(id)) // no worker: it waits for one, its lock held
	f.waitState(id, jobstate.StateScheduled)
	_ = f.env.Redis.ShutdownNoSave(context.Background()).Err() // the connection closes: no answer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_ = f.node.Stop(ctx)
	out := logs.String()
	if !strings.Contains(out, "job lock not released at stop; it is left to expire") || !strings.Contains(out, id) {
		t.Fatalf("no warning naming %s for its lock left to expire; logs:\n%s", id, out)
	}
}
