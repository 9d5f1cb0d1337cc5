package troupe_test

import (
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// A direct dispatch reaches its worker with the request's own env and the
// node's stale-dispatch stamp (what it last heard of the worker, and the
// window it evicts by), appended to the encoded request; the job's stored
// request carries no stamp.
func TestDirectDispatchCarriesItsEnvAndTheStamp(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	got := make(chan *capv1.JobRequest, 4)
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "w1", Pool: "echo", Topics: []string{"job.echo"},
		Direct: true, SubjectPrefix: f.subj.Prefix(), Handler: worker.Echo, Heartbeat: time.Second,
		OnReceive: func(_ string, req *capv1.JobRequest) { got <- proto.Clone(req).(*capv1.JobRequest) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	f.waitWorkers(1)
	req := echoReq("job-stamp")
	req.Env = map[string]string{"K": "V", "L": "W"}
	f.submit(req)
	r := f.waitState("job-stamp", jobstate.StateSucceeded)
	var in *capv1.JobRequest
	select {
	case in = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never received the dispatch")
	}
	env := in.GetEnv()
	if env["K"] != "V" || env["L"] != "W" {
		t.Errorf("dispatched env %v lost the request's own entries", env)
	}
	heard, err1 := strconv.ParseInt(env[registry.EnvHeardBeat], 10, 64)
	window, err2 := strconv.ParseInt(env[registry.EnvEvictAfter], 10, 64)
	if err1 != nil || err2 != nil || heard <= 0 || window <= 0 {
		t.Errorf("dispatched env %v: no stale-dispatch stamp", env)
	}
	stored := &capv1.JobRequest{}
	if err := proto.Unmarshal(r.Request, stored); err != nil || !proto.Equal(stored, req) {
		t.Errorf("stored request %v (%v), want the submitted one, unstamped", stored, err)
	}
}
