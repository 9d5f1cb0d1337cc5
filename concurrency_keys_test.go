package troupe_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/keyslot"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// keyPools are the test pools with concurrency_keys.
func keyPools(t *testing.T, keys string) *troupe.Pools {
	t.Helper()
	p, err := troupe.ParsePools([]byte(testPools + "concurrency_keys:\n" + keys))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func keyedReq(id, key string) *capv1.JobRequest {
	r := echoReq(id)
	r.Meta = &capv1.JobMetadata{Labels: map[string]string{lifecycle.LabelConcurrencyKey: key}}
	return r
}

// keyCounter counts, per concurrency key, the jobs its handler holds at
// once, as a worker sees them.
type keyCounter struct {
	mu       sync.Mutex
	now, max map[string]int
	started  chan string
}

func newKeyCounter() *keyCounter {
	return &keyCounter{now: map[string]int{}, max: map[string]int{}, started: make(chan string, 100)}
}

func (k *keyCounter) handler(release <-chan struct{}) worker.Handler {
	return func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		key := req.GetMeta().GetLabels()[lifecycle.LabelConcurrencyKey]
		k.mu.Lock()
		k.now[key]++
		k.max[key] = max(k.max[key], k.now[key])
		k.mu.Unlock()
		k.started <- req.JobId
		select {
		case <-release:
		case <-ctx.Done():
		}
		k.mu.Lock()
		k.now[key]--
		k.mu.Unlock()
		return worker.Echo(ctx, req)
	}
}

func (k *keyCounter) maxOf(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.max[key]
}

// A key's limit holds across two replicas: of six jobs of key user-a
// (limit 2), the worker never holds more than two at once; the others wait
// SCHEDULED with reason concurrency_key; a job of key user-b is not held
// up by user-a's burst; when the jobs end, every slot is given back.
func TestConcurrencyKeyLimitHoldsAcrossReplicasAndOtherKeysGoOn(t *testing.T) {
	t.Parallel()
	pools := keyPools(t, "  \"*\": {limit: 2}\n")
	f := newFixture(t, func(c *troupe.Config) { c.Pools = pools })
	newNodeOn(t, f, "node-b", func(c *troupe.Config) { c.Pools = pools })
	kc := newKeyCounter()
	release := make(chan struct{})
	f.startWorker("w1", true, nil, kc.handler(release))
	f.waitWorkers(1)
	for i := range 6 {
		f.submit(keyedReq(fmt.Sprintf("a-%d", i), "user-a"))
	}
	// Two user-a jobs start; the four others wait for the key.
	for range 2 {
		<-kc.started
	}
	waiting := 0
	deadline := time.Now().Add(15 * time.Second)
	for waiting < 4 && time.Now().Before(deadline) {
		waiting = 0
		for i := range 6 {
			if r, err := f.node.Record(context.Background(), fmt.Sprintf("a-%d", i)); err == nil &&
				r.State == jobstate.StateScheduled && r.Reason == jobstate.ReasonConcurrencyKey {
				waiting++
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if waiting != 4 {
		t.Fatalf("%d user-a jobs wait with concurrency_key, want 4", waiting)
	}
	// The operators' view (GET /v1/concurrency-keys, troupe ctl keys).
	kn, ok := inspect.Of(f.node).(admin.KeyNode)
	if !ok {
		t.Fatal("the node's inspector serves no concurrency keys")
	}
	stats, on, err := kn.ConcurrencyKeys(context.Background(), 10)
	if err != nil || !on || len(stats) != 1 || stats[0] != (keyslot.Stat{Key: "user-a", Limit: 2, Strategy: "queue", Holders: 2, Waiters: 4}) {
		t.Fatalf("concurrency keys %+v on=%v err=%v", stats, on, err)
	}
	// user-b's single job has slots of its own: it starts while user-a's
	// burst waits.
	f.submit(keyedReq("b-0", "user-b"))
	select {
	case id := <-kc.started:
		if id != "b-0" {
			t.Fatalf("%s started while user-a is at its limit", id)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("user-b's job did not start while user-a's burst waited")
	}
	close(release)
	for i := range 6 {
		r := f.waitStateWithin(fmt.Sprintf("a-%d", i), jobstate.StateSucceeded, 30*time.Second)
		if r.Fields["ckey"] != "user-a" {
			t.Fatalf("a-%d: ckey %q on the record", i, r.Fields["ckey"])
		}
	}
	f.waitState("b-0", jobstate.StateSucceeded)
	if m := kc.maxOf("user-a"); m != 2 {
		t.Fatalf("the worker held %d user-a jobs at once; the limit is 2", m)
	}
	slots := keyslot.New(f.env.Client, f.env.KeyPrefix())
	held := int64(-1)
	for end := time.Now().Add(10 * time.Second); held != 0 && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		held, _ = f.env.Client.ZCard(context.Background(), slots.Holders("user-a")).Result()
	}
	if held != 0 {
		t.Fatalf("%d user-a slots still held after every job ended", held)
	}
	if w, _ := f.env.Client.ZCard(context.Background(), slots.Waiters("user-a")).Result(); w != 0 {
		t.Fatalf("%d user-a jobs still in the key's line", w)
	}
}

// cancel_newest: with its key's one slot taken, a new job ends CANCELLED
// with reason concurrency_key_cancelled, and its history says so.
func TestConcurrencyKeyCancelNewestCancelsTheNewJob(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		c.Pools = keyPools(t, "  solo: {limit: 1, strategy: cancel_newest}\n")
	})
	kc := newKeyCounter()
	release := make(chan struct{})
	defer close(release)
	f.startWorker("w1", true, nil, kc.handler(release))
	f.waitWorkers(1)
	f.submit(keyedReq("first", "solo"))
	<-kc.started
	f.submit(keyedReq("second", "solo"))
	r := f.waitState("second", jobstate.StateCancelled)
	if r.Reason != jobstate.ReasonConcurrencyKeyCancelled || !strings.Contains(r.Fields["cancel_reason"], "solo") {
		t.Fatalf("second: reason %s, cancel_reason %q", r.Reason, r.Fields["cancel_reason"])
	}
	if h := reasons(r.History); !strings.Contains(h, "CANCELLED:concurrency_key_cancelled") {
		t.Fatalf("history %s", h)
	}
	if rec, _ := f.node.Record(context.Background(), "first"); rec.State != jobstate.StateRunning &&
		rec.State != jobstate.StateDispatched {
		t.Fatalf("first is %s, want it with its worker", rec.State)
	}
}

// cancel_in_progress: a new job of a full key has the key's oldest holder
// cancelled (its worker hears the cancel) and runs once that slot is free:
// the cancelled job's slot stays counted until its deadline, since a worker
// that hears no cancel may still run it.
func TestConcurrencyKeyCancelInProgressCancelsTheOldestHolder(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(c *troupe.Config) {
		c.Pools = keyPools(t, "  solo: {limit: 1, strategy: cancel_in_progress}\n")
		c.Tuning.Timeouts = &troupe.Timeouts{Dispatch: 10 * time.Second, Running: 3 * time.Second}
	})
	kc := newKeyCounter()
	release := make(chan struct{})
	f.startWorker("w1", true, nil, kc.handler(release))
	f.waitWorkers(1)
	f.submit(keyedReq("old", "solo"))
	<-kc.started
	f.submit(keyedReq("new", "solo"))
	r := f.waitState("old", jobstate.StateCancelled)
	if !strings.Contains(r.Fields["cancel_reason"], "concurrency_key_cancelled") ||
		!strings.Contains(r.Fields["cancel_reason"], "new") {
		t.Fatalf("old: cancel_reason %q", r.Fields["cancel_reason"])
	}
	if id := <-kc.started; id != "new" {
		t.Fatalf("%s started", id)
	}
	close(release)
	n := f.waitStateWithin("new", jobstate.StateSucceeded, 20*time.Second)
	if h := reasons(n.History); !strings.Contains(h, "SCHEDULED:concurrency_key") {
		t.Fatalf("new's history %s: no wait for the key", h)
	}
	if m := kc.maxOf("solo"); m != 1 {
		t.Fatalf("the worker held %d solo jobs at once; the limit is 1", m)
	}
}

// A released slot goes to the oldest waiter of its key, whichever of two
// replicas holds that job: with key k limited to 1 and its waiters spread
// over node-a and node-b, each end of the running job starts the job that
// has waited longest (the key's line order), never a younger one that the
// other node woke first; the worker never holds two jobs of k.
func TestConcurrencyKeyReleasedSlotGoesToTheOldestWaiterAcrossNodes(t *testing.T) {
	t.Parallel()
	pools := keyPools(t, "  \"k\": {limit: 1}\n")
	f := newFixture(t, func(c *troupe.Config) { c.Pools = pools })
	newNodeOn(t, f, "node-b", func(c *troupe.Config) { c.Pools = pools })
	ctx := context.Background()
	slots := keyslot.New(f.env.Client, f.env.KeyPrefix())
	keys := store.NewKeys(f.env.KeyPrefix())
	var mu sync.Mutex
	release := map[string]chan struct{}{}
	gate := func(id string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if release[id] == nil {
			release[id] = make(chan struct{})
		}
		return release[id]
	}
	var held, most int
	started := make(chan string, 64)
	f.startWorker("w1", true, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		mu.Lock()
		held++
		most = max(most, held)
		mu.Unlock()
		started <- req.JobId
		select {
		case <-gate(req.JobId):
		case <-ctx.Done():
		}
		mu.Lock()
		held--
		mu.Unlock()
		return worker.Echo(ctx, req)
	})
	f.waitWorkers(1)
	next := func() string {
		t.Helper()
		select {
		case id := <-started:
			return id
		case <-time.After(20 * time.Second):
			t.Fatal("no job of k started")
			return ""
		}
	}
	f.submit(keyedReq("h", "k"))
	if id := next(); id != "h" {
		t.Fatalf("%s started first", id)
	}
	// Waiters one at a time, each in the key's line before the next is
	// submitted (the line's order is the submit order), until both nodes
	// hold some: the owner is the job lock's "<node>|…".
	var line []string
	owners := map[string]int{}
	for i := 0; i < 16 && (len(line) < 4 || len(owners) < 2); i++ {
		id := fmt.Sprintf("w-%02d", i)
		f.submit(keyedReq(id, "k"))
		var n int64
		for end := time.Now().Add(15 * time.Second); n != int64(len(line)+1) && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			n, _ = f.env.Client.ZCard(ctx, slots.Waiters("k")).Result()
		}
		if n != int64(len(line)+1) {
			t.Fatalf("%s: %d in k's line, want %d", id, n, len(line)+1)
		}
		owner, _, _ := strings.Cut(f.env.Redis.Get(ctx, keys.Lock(id)).Val(), "|")
		owners[owner]++
		line = append(line, id)
	}
	if len(owners) < 2 {
		t.Fatalf("k's %d waiters all on %v: the test needs both nodes", len(line), owners)
	}
	t.Logf("line %v, owners %v", line, owners)
	// Each end hands the slot to the oldest waiter left.
	prev := "h"
	for _, want := range line {
		close(gate(prev))
		if id := next(); id != want {
			t.Fatalf("after %s ended, %s started; the oldest waiter is %s (line %v)", prev, id, want, line)
		}
		prev = want
	}
	close(gate(prev))
	f.waitState(prev, jobstate.StateSucceeded)
	mu.Lock()
	defer mu.Unlock()
	if most != 1 {
		t.Fatalf("the worker held %d jobs of k at once; the limit is 1", most)
	}
}
