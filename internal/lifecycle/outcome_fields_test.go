package lifecycle

import (
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// A worker's result writes "worker" only when it is not the worker the
// record holds already (the dispatch's), and "execution_ms" only when the
// worker reported a time: the fields a finish leaves out read the same
// (store.ExpandRecord). The result of another worker than the job's is
// recorded with its worker, through the output policy too.
func TestResultWritesWorkerAndTimeOnlyWhenTheRecordLacksThem(t *testing.T) {
	cases := []struct {
		name     string
		worker   string
		ms       int64
		output   bool
		wantSet  map[string]string
		wantGone []string
	}{
		{"dispatched worker, no time", "w1", 0, false, map[string]string{"result_ptr": "p"}, []string{"worker", "execution_ms"}},
		{"dispatched worker, a time", "w1", 42, false, map[string]string{"execution_ms": "42"}, []string{"worker"}},
		{"no worker named", "", 0, false, map[string]string{"worker": ""}, []string{"execution_ms"}},
		// A stock CAP worker of the pool took the job the node picked for
		// w1 (it pulls the pool subject, sends no progress): its result
		// names it.
		{"another worker of the pool", "w2", 0, false, map[string]string{"worker": "w2"}, []string{"execution_ms"}},
		{"through the output policy", "w1", 7, true, map[string]string{"execution_ms": "7"}, []string{"worker"}},
		{"through the output policy, no time", "w1", 0, true, map[string]string{"result_ptr": "p"}, []string{"worker", "execution_ms"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := newDriver(t)
			d.j.cfg.Output = c.output
			d.dispatch()
			if d.j.Worker != "w1" {
				t.Fatalf("dispatched to %q", d.j.Worker)
			}
			fx := d.feed(&Result{Res: &capv1.JobResult{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED,
				WorkerId: c.worker, ExecutionMs: c.ms, ResultPtr: "p"}})
			if c.output {
				ask, ok := find[AskOutput](fx)
				if !ok {
					t.Fatalf("no output check: %v", fx)
				}
				fx = d.feed(&OutputDone{Epoch: ask.Epoch, Outcome: OutputOutcome{Phase: "meta", ContentChecked: true, ResultPtr: "p"},
					Res: ask.Res, Path: ask.Path})
			}
			w, ok := find[*Write](fx)
			if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateSucceeded {
				t.Fatalf("no terminal write: %v", fx)
			}
			f := fieldsOf(t, fx)
			for k, v := range c.wantSet {
				if got, ok := f[k]; !ok || got != v {
					t.Errorf("field %s = %q (set %v), want %q; fields %v", k, got, ok, v, f)
				}
			}
			for _, k := range c.wantGone {
				if _, ok := f[k]; ok {
					t.Errorf("field %s written: %v", k, f)
				}
			}
		})
	}
}
