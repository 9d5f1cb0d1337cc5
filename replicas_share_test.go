package troupe_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
)

// TestReplicasShareTheWork: three replicas taking submits from the shared
// stream, with stock CAP workers whose slots they split (router/owners.go),
// each dispatch a fair part of the jobs — not the one replica that would
// own the workers while the others wait for its offers, reach their
// admission bound and stop pulling submits (issue 33, deliverable 1). The
// bound, a fifth of the jobs each (a fair part is a third), leaves room for
// the scheduling of a loaded machine; before the shares, a replica that
// owned no worker dispatched a handful.
func TestReplicasShareTheWork(t *testing.T) {
	t.Parallel()
	// A small admission bound stands for a full one under a long burst: a
	// replica whose jobs cannot be placed at once reaches it and pauses its
	// submit fetches.
	admit := func(cfg *troupe.Config) { cfg.Tuning.MaxAdmitting = 16 }
	f := newFixture(t, admit)
	a := f.node
	b := newNodeOn(t, f, "node-b", admit)
	c := newNodeOn(t, f, "node-c", admit)
	f.node = a
	nodes := []*troupe.Node{a, b, c}
	answer := func(string) bool { return true }
	for i := range 2 {
		startCapWorker(t, f.env.NATS, f.subj, "share-w"+strconv.Itoa(i), 3, 100*time.Millisecond, answer)
	}
	for _, n := range nodes {
		f.node = n
		f.waitWorkers(2)
	}
	f.node = a
	const jobs, submitters = 1500, 5
	var wg sync.WaitGroup
	errs := make(chan error, submitters)
	for s := range submitters {
		wg.Add(1)
		go func() { // submits from several clients at once, as fast as JetStream takes them
			defer wg.Done()
			for i := s; i < jobs; i += submitters {
				id := "share-" + strconv.Itoa(i)
				data, err := bus.EncodeRequest("trace-"+id, "test-client", echoReq(id))
				if err == nil {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					_, err = f.js.Publish(ctx, f.subj.Submit, data)
					cancel()
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range jobs {
		f.waitStateWithin("share-"+strconv.Itoa(i), jobstate.StateSucceeded, 60*time.Second)
	}
	var total float64
	got := make([]float64, len(nodes))
	for i, n := range nodes {
		got[i] = waitCounter(t, n, "troupe_jobs_dispatched_total", "", 0)
		total += got[i]
	}
	t.Logf("dispatched per node %v of %d jobs", got, jobs)
	if total < jobs {
		t.Fatalf("nodes dispatched %v jobs in all, want at least %d", total, jobs)
	}
	for i, n := range nodes {
		if got[i] < jobs/5 {
			t.Fatalf("node %s dispatched %v of %d jobs (all: %v), want at least a fifth", n.ID(), got[i], jobs, got)
		}
	}
}
