package schedule_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/schedule"
	"github.com/troupe-run/troupe/proto/capv1"
)

// TestScheduleBenchDelayedBurst measures how late N delayed jobs due at
// one instant reach the submit stream (its stored time minus the due
// time), with two replicas' tickers racing for them. It runs only with
// TROUPE_BENCH=1 (a timing, not a unit test); TROUPE_BENCH_JOBS sets N
// (default 1000). Target: p99 ≤ 100 ms.
//
//	TROUPE_BENCH=1 go test -count=1 -v -run TestScheduleBenchDelayedBurst ./internal/schedule/
func TestScheduleBenchDelayedBurst(t *testing.T) {
	if os.Getenv("TROUPE_BENCH") != "1" {
		t.Skip("a timing: set TROUPE_BENCH=1")
	}
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("TROUPE_BENCH_JOBS")); err == nil && v > 0 {
		n = v
	}
	r := newRig(t)
	ctx := context.Background()
	a, b := r.ticker(nil), r.ticker(nil)
	for _, tk := range []*schedule.Ticker{a, b} {
		if err := tk.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer tk.Stop(ctx)
	}
	due := time.Now().Add(3 * time.Second).Truncate(time.Millisecond)
	var wg sync.WaitGroup
	at := due.Format(time.RFC3339Nano)
	for i := range n {
		req := &capv1.JobRequest{JobId: fmt.Sprintf("burst-%05d", i), Topic: "job.test",
			Meta: &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAt: at}}}
		tk := a
		if i%2 == 1 {
			tk = b
		}
		wg.Add(1)
		if held, bad := tk.Hold(req, "", time.Now(), func(err error) {
			if err != nil {
				t.Error(err)
			}
			wg.Done()
		}); !held || bad != "" {
			t.Fatalf("hold %d: %v %q", i, held, bad)
		}
	}
	wg.Wait()
	if time.Now().After(due) {
		t.Fatalf("holding %d jobs took past their due time; raise the lead", n)
	}
	msgs := r.read(n)
	lags := make([]time.Duration, 0, len(msgs))
	for _, m := range msgs {
		if m.at.Before(due) {
			t.Errorf("%s stored %s before its due time", m.jobID, due.Sub(m.at))
		}
		lags = append(lags, m.at.Sub(due))
	}
	slices.Sort(lags)
	q := func(p float64) time.Duration { return lags[min(len(lags)-1, int(p*float64(len(lags))))] }
	counts := r.counts()
	dups := 0
	for _, c := range counts {
		dups += c - 1
	}
	t.Logf("%d delayed jobs due at one instant, 2 tickers: stored after due p50 %s p99 %s max %s; submitted twice: %d",
		len(lags), q(0.50), q(0.99), lags[len(lags)-1], dups)
	if len(msgs) != n || dups != 0 {
		t.Errorf("stream holds %d, submitted twice %d; want %d and 0", len(msgs), dups, n)
	}
}
