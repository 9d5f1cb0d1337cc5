package troupe_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/keyslot"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// holdCounter is a worker handler that holds every job until release
// closes, counting the jobs it holds at once.
type holdCounter struct {
	mu       sync.Mutex
	now, max int
	started  chan string
}

func (h *holdCounter) handler(release <-chan struct{}) worker.Handler {
	return func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		h.mu.Lock()
		h.now++
		h.max = max(h.max, h.now)
		h.mu.Unlock()
		h.started <- req.JobId
		select {
		case <-release:
		case <-ctx.Done():
		}
		h.mu.Lock()
		h.now--
		h.mu.Unlock()
		return worker.Echo(ctx, req)
	}
}

// orphanDispatch writes what a dead node "ghost" left behind: job id
// DISPATCHED to w1, its lock about to expire and its lease past, its
// dispatch's write having landed a minute ago, two minutes after the job
// asked for its slot (askField: tsat or ksat) — so late that the repair
// had freed the slot meanwhile and another job holds it now. extra are
// more record fields.
func orphanDispatch(t *testing.T, f *fixture, req *capv1.JobRequest, askField string, extra ...any) {
	t.Helper()
	ctx := context.Background()
	keys := store.NewKeys(f.env.KeyPrefix())
	now, err := f.env.Redis.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := proto.Marshal(req)
	id := req.JobId
	fields := []any{"s", "DISPATCHED", "fence", 1, "topic", req.Topic, "req", raw, "worker", "w1",
		"subj", f.subj.Worker("w1"), "deadline", now.Add(time.Hour).UnixMilli(), "deadline_kind", "dispatch_timeout",
		"created", now.Add(-3 * time.Minute).UnixMilli(), "node", "ghost", "resend", "1",
		askField, now.Add(-3 * time.Minute).UnixMilli(), jobstate.FieldLanded, now.Add(-time.Minute).UnixMilli(),
		"hn", 1, "h1", "120000|DISPATCHED|dispatched|ghost"}
	fields = append(fields, extra...)
	if err := f.env.Redis.HSet(ctx, keys.Job(id), fields...).Err(); err != nil {
		t.Fatal(err)
	}
	f.env.Redis.Set(ctx, keys.Lock(id), "ghost|1", time.Millisecond)
	f.env.Redis.ZAdd(ctx, keys.Leases(store.Shard(id)), redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: id})
}

// waitWithheld waits until the job's history shows node-a took its
// adopted dispatch back to SCHEDULED for reason.
func waitWithheld(t *testing.T, f *fixture, id string, reason jobstate.Reason) {
	t.Helper()
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if r, err := f.node.Record(context.Background(), id); err == nil {
			for i, h := range r.History {
				if i > 0 && r.History[i-1].To == jobstate.StateDispatched && h.To == jobstate.StateScheduled &&
					h.Reason == reason && h.Node == "node-a" {
					return
				}
			}
		}
		if time.Now().After(end) {
			var hist []store.HistoryEntry
			if r, err := f.node.Record(context.Background(), id); err == nil {
				hist = r.History[:min(len(r.History), 4)]
			}
			t.Fatalf("the adopted stale dispatch of %s was not withheld (%s): history %+v", id, reason, hist)
		}
	}
}

// adoptFast: orphans adopted within moments; waits for a slot never fail
// the job.
func adoptFast(c *troupe.Config) {
	c.Tuning.DuePoll = 50 * time.Millisecond
	c.Tuning.DueSlack = 50 * time.Millisecond
	c.Tuning.MaxSchedulingAttempts = 100_000
	troupe.SetBackoff(c, func(int) time.Duration { return 200 * time.Millisecond })
}

// A dead node's DISPATCHED record whose write landed long after its job
// asked for its tenant slot (the slot freed by the repair meanwhile and
// taken by another job of the tenant) is adopted and withheld: node-a
// does not resend it, takes it back to SCHEDULED (tenant_limit) and asks
// for a slot again, so the tenant (limit 1) never has two jobs with the
// worker; once the slot's holder ends, the job runs (seed 837).
func TestTenantLimitAdoptedDispatchOnAStaleSlotIsWithheld(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		adoptFast(c)
		c.Tuning.TenantLimits = map[string]int{"acme": 1}
	})
	h := &holdCounter{started: make(chan string, 10)}
	release := make(chan struct{})
	f.startWorker("w1", true, nil, h.handler(release))
	holder := echoReq("acme-holder")
	holder.TenantId = "acme"
	f.submit(holder)
	select {
	case <-h.started:
	case <-time.After(15 * time.Second):
		t.Fatal("the slot's holder never started")
	}
	stale := echoReq("acme-stale")
	stale.TenantId = "acme"
	orphanDispatch(t, f, stale, "tsat", "tslot", "1")
	waitWithheld(t, f, "acme-stale", jobstate.ReasonTenantLimit)
	// It waits for the slot (no worker has it).
	f.waitState("acme-stale", jobstate.StateScheduled)
	select {
	case id := <-h.started:
		t.Fatalf("%s reached the worker while acme-holder held the tenant's one slot", id)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	f.waitState("acme-holder", jobstate.StateSucceeded)
	f.waitStateWithin("acme-stale", jobstate.StateSucceeded, 30*time.Second)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.max != 1 {
		t.Fatalf("the worker held %d acme jobs at once; the limit is 1", h.max)
	}
}

// The same for a concurrency key (limit 1): the adopter withholds the
// dispatch (concurrency_key) and the job waits for its key's slot.
func TestConcurrencyKeyAdoptedDispatchOnAStaleSlotIsWithheld(t *testing.T) {
	t.Parallel()
	pools := keyPools(t, "  \"*\": {limit: 1}\n")
	f := newFixture(t, func(c *troupe.Config) {
		adoptFast(c)
		c.Pools = pools
	})
	h := &holdCounter{started: make(chan string, 10)}
	release := make(chan struct{})
	f.startWorker("w1", true, nil, h.handler(release))
	f.submit(keyedReq("key-holder", "user-a"))
	select {
	case <-h.started:
	case <-time.After(15 * time.Second):
		t.Fatal("the slot's holder never started")
	}
	orphanDispatch(t, f, keyedReq("key-stale", "user-a"), "ksat", "ckey", "user-a")
	waitWithheld(t, f, "key-stale", jobstate.ReasonConcurrencyKey)
	select {
	case id := <-h.started:
		t.Fatalf("%s reached the worker while key-holder held the key's one slot", id)
	case <-time.After(300 * time.Millisecond):
	}
	if r, err := f.node.Record(context.Background(), "key-stale"); err != nil || r.State != jobstate.StateScheduled {
		t.Fatalf("the withheld job: %+v %v, want SCHEDULED", r, err)
	}
	close(release)
	f.waitState("key-holder", jobstate.StateSucceeded)
	f.waitStateWithin("key-stale", jobstate.StateSucceeded, 30*time.Second)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.max != 1 {
		t.Fatalf("the worker held %d user-a jobs at once; the limit is 1", h.max)
	}
	slots := keyslot.New(f.env.Client, f.env.KeyPrefix())
	held := int64(-1)
	for end := time.Now().Add(10 * time.Second); held != 0 && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		held, _ = f.env.Client.ZCard(context.Background(), slots.Holders("user-a")).Result()
	}
	if held != 0 {
		t.Fatalf("%d user-a slots still held after both jobs ended", held)
	}
}
