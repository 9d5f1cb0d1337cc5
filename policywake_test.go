package troupe_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// downPolicy fails every check (a kernel that is down) until up is set.
type downPolicy struct {
	up     atomic.Bool
	checks atomic.Int64
}

func (p *downPolicy) Check(context.Context, *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	p.checks.Add(1)
	if !p.up.Load() {
		return nil, errors.New("kernel unavailable")
	}
	return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}, nil
}

// Jobs that found the policy unavailable back off (here: an hour). When the
// policy answers again, the first successful check — a new job's, or the
// probe the node makes every second while jobs wait — wakes them, so they do
// not wait out their backoff.
func policyComesBack(t *testing.T, withNewJob bool) {
	pol := &downPolicy{}
	f := newFixture(t, func(c *troupe.Config) {
		c.Policy = pol
		troupe.SetBackoff(c, func(int) time.Duration { return time.Hour })
	})
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "w1", Pool: "echo", Topics: []string{"job.echo"},
		Direct: true, SubjectPrefix: f.subj.Prefix(), Heartbeat: time.Second, MaxParallel: 10000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	f.waitWorkers(1)
	const waiting = 150 // more than one wake batch
	for i := 0; i < waiting; i++ {
		f.submit(echoReq(fmt.Sprintf("pw-%d", i)))
	}
	// Every job asked once, was refused, and now sits on its backoff.
	deadline := time.Now().Add(15 * time.Second)
	for pol.checks.Load() < waiting {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d jobs asked the policy", pol.checks.Load(), waiting)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := 0; i < waiting; i += 37 {
		f.waitState(fmt.Sprintf("pw-%d", i), jobstate.StatePending)
	}
	pol.up.Store(true)
	if withNewJob {
		f.submit(echoReq("pw-after")) // its check is the first to succeed
		f.waitState("pw-after", jobstate.StateSucceeded)
	}
	// Otherwise the node's prober wakes one waiter a second; its success
	// wakes the rest.
	for i := 0; i < waiting; i++ {
		f.waitStateWithin(fmt.Sprintf("pw-%d", i), jobstate.StateSucceeded, 15*time.Second)
	}
}

func TestJobsWaitingOnAnUnavailablePolicyWakeWhenItAnswers(t *testing.T) {
	t.Parallel()
	policyComesBack(t, true)
}

func TestJobsWaitingOnAnUnavailablePolicyFindItBackWithNoNewJob(t *testing.T) {
	t.Parallel()
	policyComesBack(t, false)
}
