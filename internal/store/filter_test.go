package store_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// TestListJobsSinceEndsTheScan: a listing with Since ends at the first
// index entry updated before it — with no cursor, though the scan budget
// would have allowed more pages — and Match keeps only what it accepts.
func TestListJobsSinceEndsTheScan(t *testing.T) {
	t.Parallel()
	f := newListFixture(t)
	const n = 300
	for i := range n {
		f.put(t, "since-"+strconv.Itoa(i), jobstate.StateSucceeded, "t", int64(10_000+i), true)
	}
	// Created = updated - 5: jobs 280..299 are created at or after since.
	since := time.UnixMilli(10_000 + 280 - 5)
	reads := 0
	p, err := f.s.ListJobs(context.Background(), store.ListQuery{State: jobstate.StateSucceeded, Limit: 10, Since: since,
		Match: func(*store.JobSummary) bool { reads++; return false }})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Jobs) != 0 || p.Next != "" || reads != 20 {
		t.Fatalf("a filter matching nothing since %v: %d jobs, next %q, %d matched against; want none, no cursor, 20",
			since, len(p.Jobs), p.Next, reads)
	}
	ids := f.all(t, store.ListQuery{State: jobstate.StateSucceeded, Limit: 4, Since: since,
		Match: func(s *store.JobSummary) bool { i, _ := strconv.Atoi(s.ID[len("since-"):]); return i%5 == 0 }})
	if want := []string{"since-295", "since-290", "since-285", "since-280"}; !slices.Equal(ids, want) {
		t.Fatalf("listed %v, want %v", ids, want)
	}
}
