package lifecycle

import (
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// A started job told that its worker was lost, as of an eviction before
// the job reached this actor (adopted from a dead node), counts its
// worker-lost grace from the eviction, not from now; one whose grace has
// run out already ends at once (issue 29, item 2).
func TestWorkerLostGraceRunsFromTheEviction(t *testing.T) {
	for _, c := range []struct {
		ago  time.Duration // eviction before the WorkerLost reaches the job
		want time.Duration // the worker_lost deadline, from now
	}{{0, time.Minute}, {40 * time.Second, 20 * time.Second}, {2 * time.Minute, -time.Minute}} {
		d := newDriver(t)
		d.j.cfg.WorkerLostGrace = time.Minute
		d.dispatch()
		d.feed(&Progress{P: &capv1.JobProgress{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_RUNNING}, From: "w1"})
		d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
		if d.j.State != jobstate.StateRunning {
			t.Fatalf("not running: %s", d.j.State)
		}
		d.now = d.now.Add(45 * time.Second)
		var at time.Time
		if c.ago > 0 {
			at = d.now.Add(-c.ago)
		}
		fx := d.feed(&WorkerLost{WorkerID: "w1", At: at})
		w, ok := find[*Write](fx)
		if !ok || w.Op.T == nil || w.Op.T.Due != d.now.Add(c.want).UnixMilli() {
			t.Fatalf("evicted %v ago: %v, want a worker_lost deadline %v from now", c.ago, fx, c.want)
		}
	}
}
