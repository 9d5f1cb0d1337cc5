package admin_test

import (
	"context"
	"strings"
	"testing"

	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/worker"
)

func TestTraceEndpointWithTracingOff(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	c := b.client("")
	b.startWorker("w1", worker.Echo)
	if _, err := c.Submit(ctx, echoReq("job-untraced", "")); err != nil {
		t.Fatal(err)
	}
	b.waitState(c, "job-untraced", "SUCCEEDED")
	tr, err := c.Trace(ctx, "job-untraced")
	if err != nil || tr.Tracing || tr.Entries == nil || len(tr.Entries) != 0 {
		t.Fatalf("trace with tracing off: %+v %v", tr, err)
	}
}

// TestTraceOfAJobFromSubmitToSucceeded runs against a node whose job actors
// are traced: TROUPE_JOB_TRACE=on turns tracing on, as README says.
func TestTraceOfAJobFromSubmitToSucceeded(t *testing.T) {
	t.Setenv("TROUPE_JOB_TRACE", "on")
	b := setup(t, options{})
	if !inspect.Of(b.node).JobTraceEnabled() {
		t.Fatal("TROUPE_JOB_TRACE=on: the node does not trace its job actors")
	}
	ctx := context.Background()
	c := b.client("")
	b.startWorker("w1", worker.Echo)
	if _, err := c.Submit(ctx, echoReq("job-traced", "")); err != nil {
		t.Fatal(err)
	}
	b.waitState(c, "job-traced", "SUCCEEDED")
	var got []string
	for i := 0; i < 200; i++ {
		tr, err := c.Trace(ctx, "job-traced")
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, e := range tr.Entries {
			got = append(got, e.Type)
		}
		if len(tr.Entries) > 0 && tr.Entries[len(tr.Entries)-1].Type == "*actor.Stopped" {
			// The states the actor reported, first to last.
			var states []string
			for _, e := range tr.Entries {
				if e.After != "" && (len(states) == 0 || states[len(states)-1] != e.After) {
					states = append(states, e.After)
				}
			}
			if tr.Entries[0].Type != "*actor.Started" || !strings.Contains(strings.Join(got, " "), "*lifecycle.Submit") ||
				states[len(states)-1] != "SUCCEEDED" || !strings.Contains(strings.Join(states, " "), "DISPATCHED") {
				t.Fatalf("trace types %v, states %v", got, states)
			}
			return
		}
		b.waitState(c, "job-traced", "SUCCEEDED")
	}
	t.Fatalf("trace never ended with the actor's stop: %v", got)
}
