package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// listFixture writes job records and index entries directly, so a test
// controls update times down to the millisecond (ties included).
type listFixture struct {
	s   *store.Store
	rdb redis.UniversalClient
}

func newListFixture(t *testing.T) *listFixture {
	t.Helper()
	env := testenv.New(t)
	s := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	return &listFixture{s: s, rdb: env.Client}
}

// put indexes job id in state at updated (unix ms) with a record, unless
// record is false (a record that expired while its index entry stayed).
func (f *listFixture) put(t *testing.T, id string, state jobstate.State, tenant string, updated int64, record bool) {
	t.Helper()
	ctx := context.Background()
	k := f.s.Keys()
	if record {
		if err := f.rdb.HSet(ctx, k.Job(id), "s", string(state), "tenant", tenant, "topic", "job.x",
			"updated", updated, "created", updated-5, "reason", "test").Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.rdb.ZAdd(ctx, k.Index(store.Shard(id), string(state)), redis.Z{Score: float64(updated), Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
}

// all pages through q and returns the ids in order, failing on a repeat.
func (f *listFixture) all(t *testing.T, q store.ListQuery) []string {
	t.Helper()
	var ids []string
	seen := map[string]bool{}
	for page := 0; page < 1000; page++ {
		p, err := f.s.ListJobs(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Jobs) > max(q.Limit, 1) {
			t.Fatalf("page of %d, limit %d", len(p.Jobs), q.Limit)
		}
		for _, j := range p.Jobs {
			if seen[j.ID] {
				t.Fatalf("job %s listed twice (page %d)", j.ID, page)
			}
			seen[j.ID] = true
			ids = append(ids, j.ID)
		}
		if p.Next == "" {
			return ids
		}
		q.Cursor = p.Next
	}
	t.Fatal("listing never ended")
	return nil
}

func TestListJobsPagesThroughEveryShardNewestFirst(t *testing.T) {
	t.Parallel()
	f := newListFixture(t)
	base := time.Now().UnixMilli()
	var want []string
	for i := 149; i >= 0; i-- { // newest first: job-149 has the latest update
		want = append(want, fmt.Sprintf("job-%03d", i))
	}
	for i := 0; i < 150; i++ {
		f.put(t, fmt.Sprintf("job-%03d", i), jobstate.StateRunning, "t", base+int64(i), true)
	}
	f.put(t, "other-state", jobstate.StatePending, "t", base+500, true)
	got := f.all(t, store.ListQuery{State: jobstate.StateRunning, Limit: 7})
	if !slices.Equal(got, want) {
		t.Fatalf("listed %d jobs:\n%v\nwant\n%v", len(got), got, want)
	}
	p, err := f.s.ListJobs(context.Background(), store.ListQuery{State: jobstate.StateRunning, Limit: 1})
	if err != nil || len(p.Jobs) != 1 {
		t.Fatal(err)
	}
	j := p.Jobs[0]
	if j.ID != "job-149" || j.State != jobstate.StateRunning || j.Tenant != "t" || j.Topic != "job.x" ||
		j.Updated.UnixMilli() != base+149 || j.Created.UnixMilli() != base+144 {
		t.Fatalf("summary %+v", j)
	}
}

func TestListJobsKeepsJobsThatShareAMillisecond(t *testing.T) {
	t.Parallel()
	f := newListFixture(t)
	at := time.Now().UnixMilli()
	var want []string
	for i := 0; i < 40; i++ {
		id := fmt.Sprintf("bulk-%02d", i)
		f.put(t, id, jobstate.StateSucceeded, "t", at, true)
		want = append(want, id)
	}
	f.put(t, "later", jobstate.StateSucceeded, "t", at+1, true)
	f.put(t, "earlier", jobstate.StateSucceeded, "t", at-1, true)
	slices.Reverse(want) // equal times: id descending
	want = append(append([]string{"later"}, want...), "earlier")
	for _, limit := range []int{1, 3, 7, 50} {
		if got := f.all(t, store.ListQuery{State: jobstate.StateSucceeded, Limit: limit}); !slices.Equal(got, want) {
			t.Fatalf("limit %d: listed\n%v\nwant\n%v", limit, got, want)
		}
	}
}

func TestListJobsFiltersByTenantAndSkipsExpiredRecords(t *testing.T) {
	t.Parallel()
	f := newListFixture(t)
	base := time.Now().UnixMilli()
	var want []string
	for i := 0; i < 60; i++ {
		tenant := "big"
		if i%20 == 0 {
			tenant = "small"
		}
		id := fmt.Sprintf("j-%02d", i)
		f.put(t, id, jobstate.StateFailed, tenant, base+int64(i), i != 40)
		if tenant == "small" && i != 40 {
			want = append([]string{id}, want...)
		}
	}
	got := f.all(t, store.ListQuery{State: jobstate.StateFailed, Tenant: "small", Limit: 2})
	if !slices.Equal(got, want) {
		t.Fatalf("tenant small: %v, want %v (j-40 has no record)", got, want)
	}
	if got := f.all(t, store.ListQuery{State: jobstate.StateFailed, Limit: 100}); len(got) != 59 {
		t.Fatalf("all tenants: %d jobs, want the 59 with records", len(got))
	}
}

func TestListJobsRefusesWhatItCannotRead(t *testing.T) {
	t.Parallel()
	f := newListFixture(t)
	ctx := context.Background()
	for _, c := range []string{"garbage", "1:x:job", "1:-1:job", "1:0:job", "12:3:"} {
		if _, err := f.s.ListJobs(ctx, store.ListQuery{State: jobstate.StateRunning, Cursor: c}); !errors.Is(err, store.ErrBadCursor) {
			t.Errorf("cursor %q: %v, want ErrBadCursor", c, err)
		}
	}
	if _, err := f.s.ListJobs(ctx, store.ListQuery{State: "NOPE"}); err == nil {
		t.Error("unknown state listed")
	}
	if p, err := f.s.ListJobs(ctx, store.ListQuery{State: jobstate.StateRunning}); err != nil || len(p.Jobs) != 0 || p.Next != "" {
		t.Errorf("empty state: %+v %v", p, err)
	}
}

func TestCountStatesAndTenants(t *testing.T) {
	t.Parallel()
	f := newListFixture(t)
	now := time.Now().UnixMilli()
	for i := 0; i < 5; i++ {
		f.put(t, fmt.Sprint("r", i), jobstate.StateRunning, "a", now, true)
	}
	f.put(t, "p0", jobstate.StatePending, "b", now, true)
	counts, err := f.s.CountStates(context.Background())
	if err != nil || counts[jobstate.StateRunning] != 5 || counts[jobstate.StatePending] != 1 || counts[jobstate.StateFailed] != 0 ||
		len(counts) != len(jobstate.AllStates) {
		t.Fatalf("counts %v %v", counts, err)
	}
	ts, err := f.s.Tenants(context.Background(), []string{"r1", "p0", "missing"})
	if err != nil || ts["r1"] != "a" || ts["p0"] != "b" || len(ts) != 2 {
		t.Fatalf("tenants %v %v", ts, err)
	}
}

func TestDLQEntriesCanBeReadDeletedAndRetriedOnce(t *testing.T) {
	t.Parallel()
	f := newListFixture(t)
	ctx := context.Background()
	if err := f.s.AddDLQ(ctx, &store.DLQEntry{JobID: "j1", Topic: "job.x", Reason: jobstate.ReasonTopicUnmapped}); err != nil {
		t.Fatal(err)
	}
	es, err := f.s.ListDLQ(ctx, 10)
	if err != nil || len(es) != 1 {
		t.Fatalf("list %v %v", es, err)
	}
	id := es[0].ID
	e, err := f.s.DLQEntryByID(ctx, id)
	if err != nil || e.JobID != "j1" || e.Reason != jobstate.ReasonTopicUnmapped {
		t.Fatalf("entry %+v %v", e, err)
	}
	for _, bad := range []string{"nope", "1-", "0-0"} {
		if _, err := f.s.DLQEntryByID(ctx, bad); !errors.Is(err, store.ErrDLQNotFound) {
			t.Errorf("entry %q: %v, want ErrDLQNotFound", bad, err)
		}
	}

	// The first retry claims the entry; a second is refused and names the
	// job the first became; force overrides.
	if err := f.s.ClaimDLQRetry(ctx, id, "j1-retry1", false); err != nil {
		t.Fatal(err)
	}
	if err := f.s.ClaimDLQRetry(ctx, id, "j1-retry2", false); !errors.Is(err, store.ErrAlreadyRetried) ||
		!strings.Contains(err.Error(), "j1-retry1") {
		t.Fatalf("second claim: %v", err)
	}
	// Releasing someone else's claim leaves it alone.
	if err := f.s.ReleaseDLQRetry(ctx, id, "j1-retry2"); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.s.DLQRetried(ctx, id); got != "j1-retry1" {
		t.Fatalf("mark after a foreign release: %q", got)
	}
	if err := f.s.ClaimDLQRetry(ctx, id, "j1-retry2", true); err != nil {
		t.Fatal(err)
	}
	marks, err := f.s.DLQRetriedMany(ctx, []string{id, "1-1"})
	if err != nil || marks[id] != "j1-retry2" || len(marks) != 1 {
		t.Fatalf("marks %v %v", marks, err)
	}
	if ttl := f.rdb.TTL(ctx, f.s.Keys().DLQRetried(id)).Val(); ttl <= 0 || ttl > store.RetentionDefault {
		t.Fatalf("retry mark TTL %v", ttl)
	}

	if err := f.s.DeleteDLQ(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := f.s.DeleteDLQ(ctx, id); !errors.Is(err, store.ErrDLQNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if got, _ := f.s.DLQRetried(ctx, id); got != "" {
		t.Fatalf("retry mark outlived its entry: %q", got)
	}
}

func TestRetryLinksBothWays(t *testing.T) {
	t.Parallel()
	f := newListFixture(t)
	ctx := context.Background()
	for want := int64(1); want <= 2; want++ {
		if n, err := f.s.NextRetryNumber(ctx, "orig"); err != nil || n != want {
			t.Fatalf("retry number %d %v, want %d", n, err, want)
		}
	}
	if err := f.s.LinkRetry(ctx, "orig", "orig-retry1", "5-0"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	if err := f.s.LinkRetry(ctx, "orig", "orig-retry2", "5-0"); err != nil {
		t.Fatal(err)
	}
	l, err := f.s.Links(ctx, "orig")
	if err != nil || !slices.Equal(l.Retries, []string{"orig-retry1", "orig-retry2"}) || l.RetryOf != "" {
		t.Fatalf("original's links %+v %v", l, err)
	}
	l, err = f.s.Links(ctx, "orig-retry2")
	if err != nil || l.RetryOf != "orig" || l.DLQEntry != "5-0" || len(l.Retries) != 0 {
		t.Fatalf("retry's links %+v %v", l, err)
	}
	if l, err := f.s.Links(ctx, "unrelated"); err != nil || l.RetryOf != "" || l.Retries != nil {
		t.Fatalf("no links: %+v %v", l, err)
	}
}

func TestPerJobKeysShareTheJobsShardTag(t *testing.T) {
	t.Parallel()
	k := store.NewKeys("p:")
	for _, id := range []string{"a", "job-1", "x:y.z"} {
		for _, key := range []string{k.Trace(id), k.Links(id)} {
			if !strings.HasPrefix(key, k.Tag(id)) || !strings.HasSuffix(key, ":"+id) {
				t.Errorf("key %q of job %s is not under its shard tag %q", key, id, k.Tag(id))
			}
		}
	}
}
