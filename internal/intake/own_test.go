package intake

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
)

// sharedCopy is the shared consumer's copy of a result: its ack is
// reported on acked.
type sharedCopy struct {
	jetstream.Msg
	name  string
	acked chan<- string
}

func (m sharedCopy) Ack() error { m.acked <- m.name; return nil }

// The shared consumer's copy of a result leaves the stream (is acked
// unread) only when the job's record shows the result handled — a terminal
// job, or a running one for a progress report — or when this node's job
// actor settled its own copy; any other copy is handled as without the
// node's own subscription (issue 33: a result must never be
// removed before its job's record shows it processed).
func TestSharedResultCopyLeavesOnlyOnceTheRecordShowsItHandled(t *testing.T) {
	env := testenv.New(t)
	st := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &confirmer{in: &Intake{Store: st}, add: make(chan *confirmItem, 16)}
	go c.loop(ctx)

	const (
		done     = capv1.JobStatus_JOB_STATUS_SUCCEEDED
		progress = capv1.JobStatus_JOB_STATUS_RUNNING
	)
	type copyCase struct {
		name   string
		state  jobstate.State // "": no record
		status capv1.JobStatus
		acked  bool
	}
	cases := []copyCase{
		{"succeeded-result", jobstate.StateSucceeded, done, true},
		{"failed-progress", jobstate.StateFailed, progress, true},
		{"running-progress", jobstate.StateRunning, progress, true},
		{"running-result", jobstate.StateRunning, done, false},
		{"dispatched-progress", jobstate.StateDispatched, progress, false},
		{"scheduled-result", jobstate.StateScheduled, done, false},
		{"no-record", "", done, false},
		// A late result of a job that ended otherwise is handled as before
		// (its absorption counted; a stale attempt told apart).
		{"cancelled-result", jobstate.StateCancelled, done, false},
		{"succeeded-failure", jobstate.StateSucceeded, capv1.JobStatus_JOB_STATUS_FAILED, false},
		{"failed-failure", jobstate.StateFailed, capv1.JobStatus_JOB_STATUS_FAILED, true},
	}
	acked := make(chan string, len(cases)+1)
	routed := make(chan string, len(cases)+1)
	// A result whose own copy this node's job actor settled: acked without
	// a record.
	settled := &capv1.JobResult{JobId: env.Prefix + "-settled-here", Status: done, WorkerId: "w"}
	ownDelivery{set: &c.settled, key: keyOf(settled)}.Ack()
	c.hold(sharedCopy{name: "settled-here", acked: acked}, settled, func() { routed <- "settled-here" })
	cases = append(cases, copyCase{"settled-here", "", done, true})
	for _, tc := range cases[:len(cases)-1] {
		job := env.Prefix + "-" + tc.name
		if tc.state != "" {
			if err := env.Client.HSet(ctx, st.Keys().Job(job), "s", string(tc.state)).Err(); err != nil {
				t.Fatal(err)
			}
		}
		name := tc.name
		// A result of the job's second attempt names the attempt: the
		// record read is the job's.
		res := &capv1.JobResult{JobId: jobstate.AttemptID(job, 2), Status: tc.status, WorkerId: "w"}
		c.hold(sharedCopy{name: name, acked: acked}, res, func() { routed <- name })
	}
	got := map[string]bool{} // name → acked
	deadline := time.After(10 * time.Second)
	for len(got) < len(cases) {
		select {
		case n := <-acked:
			got[n] = true
		case n := <-routed:
			got[n] = false
		case <-deadline:
			t.Fatalf("settled %v of %d copies within 10 s", got, len(cases))
		}
	}
	for _, tc := range cases {
		if got[tc.name] != tc.acked {
			t.Errorf("%s: acked unread %v, want %v", tc.name, got[tc.name], tc.acked)
		}
	}
	select {
	case n := <-acked:
		t.Errorf("%s settled twice (acked after being decided)", n)
	case n := <-routed:
		t.Errorf("%s settled twice (handled after being decided)", n)
	default:
	}
}

// The confirmer holds at most ownConfirmQueue shared copies waiting for
// their read, plus as many queued to it: past that a copy is handled at
// once, so a hold's answers, all at once, do not pile up in the node
// (the result fetches go on while copies wait).
func TestConfirmerHoldsABoundedNumberOfCopies(t *testing.T) {
	env := testenv.New(t)
	st := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &confirmer{in: &Intake{Store: st}, add: make(chan *confirmItem, ownConfirmQueue)}
	done := make(chan struct{})
	go func() { defer close(done); c.loop(ctx) }()
	defer func() { cancel(); <-done }()

	var routed atomic.Int64
	const extra = 100
	total := 2*ownConfirmQueue + extra
	for i := 0; i < total; i++ {
		res := &capv1.JobResult{JobId: fmt.Sprintf("held-%d", i), WorkerId: "w1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
		c.hold(nil, res, func() { routed.Add(1) })
	}
	// None of these jobs has a record: a copy leaves the confirmer only
	// routed (at once, or after its second read).
	if n := routed.Load(); n < extra {
		t.Fatalf("%d of %d copies handled once the confirmer had taken %d, want at least %d: it holds copies without bound",
			n, total, 2*ownConfirmQueue, extra)
	}
}
