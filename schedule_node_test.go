package troupe_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/schedule"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// A delayed submit is held (listed, no record) until its time, then runs
// as an ordinary job; a schedule's ticks run as ordinary jobs.
func TestScheduleNodeRunsDelayedAndScheduledJobs(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.startWorker("w1", true, nil, worker.Echo)
	ctx := context.Background()

	req := echoReq("later-1")
	req.Labels = map[string]string{schedule.LabelRunAfter: "1500ms"}
	f.submit(req)
	var held *schedule.Delayed
	for deadline := time.Now().Add(10 * time.Second); held == nil && time.Now().Before(deadline); {
		d, err := f.node.Schedules().GetDelayed(ctx, "later-1")
		if err == nil {
			held = d
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if held == nil {
		t.Fatal("the delayed submit was never held")
	}
	if _, err := f.node.Job(ctx, "later-1"); !errors.Is(err, store.ErrNotFound) && time.Now().Before(held.Due) {
		t.Fatalf("delayed job has a record before its time: %v", err)
	}
	r := f.waitState("later-1", jobstate.StateSucceeded)
	if r.Created.Before(held.Due) {
		t.Errorf("record created %s, before the due time %s", r.Created, held.Due)
	}
	if r.TraceID != "trace-later-1" {
		t.Errorf("trace id %q not kept", r.TraceID)
	}
	stored := &capv1.JobRequest{}
	if err := proto.Unmarshal(r.Request, stored); err != nil {
		t.Fatal(err)
	}
	if stored.GetMeta().GetLabels()[schedule.LabelDelayedUntil] == "" || stored.Labels[schedule.LabelRunAfter] != "" {
		t.Errorf("stored labels %v meta %v, want delayed_until in place of run_after", stored.Labels, stored.GetMeta())
	}

	s := &schedule.Schedule{ID: "echo-every-second", Every: "1s", Topic: "job.echo"}
	if err := f.node.Schedules().Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	var last *schedule.Fired
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got, err := f.node.Schedules().Get(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Last != nil {
			last = got.Last
			break
		}
	}
	if last == nil {
		t.Fatal("the schedule never fired")
	}
	r = f.waitState(last.JobID, jobstate.StateSucceeded)
	if err := proto.Unmarshal(r.Request, stored); err != nil {
		t.Fatal(err)
	}
	if stored.GetMeta().GetLabels()[schedule.LabelSchedule] != s.ID || r.Created.Before(last.Tick) {
		t.Errorf("tick job: labels %v created %s, want the schedule's, at or after %s", stored.Labels, r.Created, last.Tick)
	}
	if err := f.node.Schedules().Delete(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}
