package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/schedule"
	"github.com/troupe-run/troupe/proto/capv1"
)

// A delayed job cancelled before its time never runs, even when its due
// time passes, and its submit delivered again by the stream (an ack lost)
// is not held again.
func TestScheduleDelayedCancelledBeforeItsTimeNeverRuns(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	start := time.Now()
	clk := &clock{now: start}
	tk := r.ticker(clk.Now)
	req := func() *capv1.JobRequest {
		return &capv1.JobRequest{JobId: "cancel-me", Topic: "job.test",
			Meta: &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAfter: "1h"}}}
	}
	if held, _, err := tk.Divert(req(), "", start); !held || err != nil {
		t.Fatal(held, err)
	}
	if err := r.store.DeleteDelayed(ctx, "cancel-me"); err != nil {
		t.Fatal(err)
	}
	if err := r.store.DeleteDelayed(ctx, "cancel-me"); !errors.Is(err, schedule.ErrNotFound) {
		t.Fatalf("second cancel: %v, want not found", err)
	}
	// The stream delivers the submit again: it is not held again.
	if held, _, err := tk.Divert(req(), "", start); !held || err != nil {
		t.Fatal(held, err)
	}
	if d, err := r.store.GetDelayed(ctx, "cancel-me"); !errors.Is(err, schedule.ErrNotFound) {
		t.Fatalf("the cancelled job's redelivered submit was held again: %+v %v", d, err)
	}
	clk.Set(start.Add(2 * time.Hour))
	if _, found, err := tk.RunOnce(ctx); err != nil || found {
		t.Fatalf("RunOnce after the due time: found %v err %v, want nothing left", found, err)
	}
	if c := r.counts(); len(c) != 0 {
		t.Fatalf("submitted %v, want nothing: the job was cancelled", c)
	}
	// Another job id is held as ever.
	other := req()
	other.JobId = "keep-me"
	if held, _, err := tk.Divert(other, "", start); !held || err != nil {
		t.Fatal(held, err)
	}
	if _, err := r.store.GetDelayed(ctx, "keep-me"); err != nil {
		t.Fatalf("another job was not held: %v", err)
	}
}

// A cancel racing the take of a job's due time ends in one outcome: the
// cancel wins and the job is never submitted, or the take wins, the job is
// submitted once and the cancel says so (ErrTaken, or not found once
// the submit is done).
func TestScheduleDelayedCancelRacingItsDueTimeHasOneOutcome(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	const n = 60
	now := time.Now()
	tk := r.ticker(func() time.Time { return now.Add(time.Hour) })
	for i := range n {
		req := &capv1.JobRequest{JobId: fmt.Sprintf("race-%d", i), Topic: "job.test",
			Meta: &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAfter: "1m"}}}
		if held, _, err := tk.Divert(req, "", now); !held || err != nil {
			t.Fatal(held, err)
		}
	}
	// The ticker drains in batches of 7 while every job is cancelled at
	// once, from 4 goroutines.
	tk = schedule.NewTicker(schedule.Config{Store: r.store, Submit: r.submit, Batch: 7,
		Now: func() time.Time { return now.Add(time.Hour) }})
	outcome := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := g; i < n; i += 4 {
				outcome[i] = r.store.DeleteDelayed(ctx, fmt.Sprintf("race-%d", i))
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		if _, _, err := tk.RunOnce(ctx); err != nil {
			t.Error(err)
		}
	}()
	close(start)
	wg.Wait()
	// Whatever the cancels left is submitted now.
	if _, found, err := tk.RunOnce(ctx); err != nil || found {
		t.Fatalf("final pass: found %v err %v", found, err)
	}
	c := r.counts()
	won, lost := 0, 0
	for i, err := range outcome {
		id := fmt.Sprintf("race-%d", i)
		switch {
		case err == nil:
			won++
			if c[id] != 0 {
				t.Errorf("%s: cancelled, yet submitted %d times", id, c[id])
			}
		case errors.Is(err, schedule.ErrTaken), errors.Is(err, schedule.ErrNotFound):
			lost++
			if c[id] != 1 {
				t.Errorf("%s: cancel lost (%v), yet submitted %d times, want once", id, err, c[id])
			}
		default:
			t.Errorf("%s: %v", id, err)
		}
	}
	if left, err := r.store.ListDelayed(ctx, "", n); err != nil || len(left) != 0 {
		t.Errorf("left delayed: %d %v", len(left), err)
	}
	t.Logf("%d cancels won, %d lost to the due time", won, lost)
}
