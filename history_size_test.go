package troupe_test

import (
	"context"
	"strings"
	"testing"

	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// An echo job's record, its history included, stays a compact hash
// (Redis's listpack) from its creation to its end: the history's fields
// are short (lua/lib/history.lua). The test logs the record's encoding and
// MEMORY USAGE (with any list an older version would have kept the
// history in), after the create (the job DISPATCHED, its worker holding
// it) and once it SUCCEEDED, for a short job id and a UUID. A UUID's
// request (the record's "req") is itself longer than a listpack value, so
// only the short id's record is checked. It is skipped where the Redis
// server has no OBJECT ENCODING (the embedded one).
func TestEchoJobHistoryKeepsItsRecordCompact(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	hold := make(chan struct{})
	f.startWorker("w1", true, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return worker.Echo(ctx, req)
	})
	ctx := context.Background()
	keys := f.node.Store().Keys()
	c := f.env.Client
	for _, id := range []string{"echo-7", "6f1c2a9e-3b7d-4e21-9c55-0d8a4b7e2f13"} {
		measure := func(when string) string {
			t.Helper()
			job := keys.Job(id)
			enc, err := c.ObjectEncoding(ctx, job).Result()
			if err != nil {
				t.Skipf("OBJECT ENCODING: %v", err)
			}
			mem := c.MemoryUsage(ctx, job, 0).Val()
			list := strings.Replace(job, ":job:", ":hist:", 1)
			lmem := c.MemoryUsage(ctx, list, 0).Val()
			n := c.HLen(ctx, job).Val()
			t.Logf("%s %s: record %s, %d fields, %d B; list %d B; total %d B", id, when, enc, n, mem, lmem, mem+lmem)
			return enc
		}
		f.submit(echoReq(id))
		f.waitState(id, core.StateDispatched)
		created := measure("after create")
		hold <- struct{}{}
		f.waitState(id, core.StateSucceeded)
		done := measure("after terminal")
		if id == "echo-7" {
			for _, enc := range []string{created, done} {
				if enc != "listpack" && enc != "ziplist" {
					t.Errorf("%s: the record is a %s, want a listpack", id, enc)
				}
			}
		}
	}
}
