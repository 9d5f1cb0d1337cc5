package troupe_test

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// Attack 6: tenant "org" with key "team:k1" and tenant "org:team" with key
// "k1" were one idempotency key: the second job was dropped while its
// submit was acked. Both are jobs.
func TestAttackIdempotencyKeysDoNotCollideAcrossTenants(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.startWorker("w1", true, newReceipts(), worker.Echo)
	for _, c := range []struct{ id, tenant, key string }{{"job-org", "org", "team:k1"}, {"job-orgteam", "org:team", "k1"}} {
		req := echoReq(c.id)
		req.TenantId = c.tenant
		req.Meta = &capv1.JobMetadata{IdempotencyKey: c.key}
		f.submit(req)
	}
	f.waitState("job-org", jobstate.StateSucceeded)
	f.waitState("job-orgteam", jobstate.StateSucceeded)
	if n := counter(t, f.node, "troupe_idempotent_duplicates_total", ""); n != 0 {
		t.Fatalf("%v submits taken for duplicates", n)
	}
}

// Attack 7: a tenant taken from env.tenant_id was never validated (60 KB,
// braces and newlines stored and listed), and labels and env of about
// 1 MB made each job a 1 MB record kept for 24 h. Both are refused at
// intake: a DLQ entry, no job.
func TestAttackUnboundedTenantFromEnvAndOversizedEnvAreRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	bad := map[string]*capv1.JobRequest{}
	r := echoReq("job-env-tenant")
	r.Env = map[string]string{"tenant_id": "{" + strings.Repeat("x\n", 30_000) + "}"}
	bad[r.JobId] = r
	r = echoReq("job-env-size")
	r.Env = map[string]string{"A": strings.Repeat("a", 40_000), "B": strings.Repeat("b", 40_000)}
	bad[r.JobId] = r
	r = echoReq("job-label-size")
	r.Labels, r.Meta = map[string]string{}, &capv1.JobMetadata{Labels: map[string]string{}}
	for i := range 20 {
		r.Labels["l"+strings.Repeat("x", i)] = strings.Repeat("v", 1000)
	}
	bad[r.JobId] = r
	for _, req := range bad {
		f.submit(req)
	}
	for id := range bad {
		e := f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == id })
		if e.Reason != jobstate.ReasonInvalidRequest {
			t.Errorf("%s: DLQ reason %s, want %s", id, e.Reason, jobstate.ReasonInvalidRequest)
		}
		if _, err := f.node.Job(context.Background(), id); err == nil {
			t.Errorf("%s: a job was created", id)
		}
	}
}

// lineLog collects log lines; safe for the node's goroutines.
type lineLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lineLog) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(l.buf.Bytes()))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func heartbeat(t *testing.T, f *fixture, hb *capv1.Heartbeat) {
	t.Helper()
	data, err := bus.EncodeHeartbeat(hb.WorkerId, hb)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.env.NATS.Publish(f.subj.Heartbeat, data); err != nil {
		t.Fatal(err)
	}
}

// Attack 7: heartbeat pool names were not validated (one 900 KB
// Prometheus label), 3,000 pool names left 3,004 troupe_live_workers
// series, 100,000 worker ids grew the registry by 120 MB, and a 400 KB
// invalid id was logged whole. Pool names are validated, the registry is
// capped in workers and pool names (refusals counted), and log lines clip
// untrusted strings.
func TestAttackHeartbeatsAreBoundedAndClippedInLogs(t *testing.T) {
	t.Parallel()
	logs := &lineLog{}
	f := newFixture(t, func(c *troupe.Config) {
		c.Tuning.MaxWorkers, c.Tuning.MaxPools = 4, 3
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	// Invalid: a 900 KB pool name, a 400 KB worker id.
	heartbeat(t, f, &capv1.Heartbeat{WorkerId: "w-big-pool", Pool: strings.Repeat("p", 900_000), MaxParallelJobs: 1})
	heartbeat(t, f, &capv1.Heartbeat{WorkerId: strings.Repeat("w", 400_000), Pool: "echo", MaxParallelJobs: 1})
	waitCounter(t, f.node, "troupe_heartbeats_invalid_total", "", 2)

	// Ten pools: the first three are admitted, the rest refused.
	for i := range 10 {
		heartbeat(t, f, &capv1.Heartbeat{WorkerId: "wp-" + string(rune('a'+i)), Pool: "pool-" + string(rune('a'+i)), MaxParallelJobs: 1})
	}
	waitCounter(t, f.node, "troupe_heartbeats_refused_total", registry.RefusedTooManyPools, 7)
	// Ten more workers in an admitted pool: one fits (four in all).
	for i := range 10 {
		heartbeat(t, f, &capv1.Heartbeat{WorkerId: "wq-" + string(rune('a'+i)), Pool: "pool-a", MaxParallelJobs: 1})
	}
	waitCounter(t, f.node, "troupe_heartbeats_refused_total", registry.RefusedTooManyWorkers, 9)
	ws, err := f.node.Workers()
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 4 {
		t.Fatalf("%d workers known, want the bound, 4: %+v", len(ws), ws)
	}
	// The pool series: the three admitted pools and the configured two.
	mfs, err := f.node.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "troupe_live_workers" && len(mf.GetMetric()) > 5 {
			t.Fatalf("troupe_live_workers has %d series, want ≤ 5", len(mf.GetMetric()))
		}
	}
	// No log line carries an untrusted string whole.
	deadline := time.Now().Add(5 * time.Second)
	for {
		lines := logs.lines()
		seen := 0
		for _, l := range lines {
			if len(l) > 2048 {
				t.Fatalf("a log line of %d bytes: %.200s…", len(l), l)
			}
			if strings.Contains(l, "heartbeat ignored") {
				seen++
			}
		}
		if seen >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("heartbeat lines seen %d, want 2; lines %d", seen, len(lines))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
