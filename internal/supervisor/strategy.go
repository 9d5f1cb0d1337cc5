package supervisor

import (
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/jobactor"
)

// Restart budget of one job actor: a transient failure restarts it (the
// fresh instance reloads the job from Redis on its next message) at most
// RestartBudget times per RestartWindow. Small on purpose: restart statistics
// cost O(failures) (protoactor keeps every failure time), and a job that keeps failing
// needs a human, not a loop.
const (
	RestartBudget = 3
	RestartWindow = time.Minute
)

// jobStrategy is the job supervisors' decider. A transient failure
// (jobactor.IsTransient) restarts the actor within the budget; anything else,
// or a failure past the budget, stops it, and the shard then marks the job
// FAILED (see JobShard, *actor.Terminated). It remembers why each child
// failed so the shard can say so.
type jobStrategy struct {
	inner   actor.SupervisorStrategy
	mu      sync.Mutex
	reasons map[string]string // child PID id → last failure
}

func newJobStrategy() *jobStrategy {
	s := &jobStrategy{reasons: map[string]string{}}
	s.inner = actor.NewOneForOneStrategy(RestartBudget, RestartWindow, func(reason interface{}) actor.Directive {
		if jobactor.IsTransient(reason) {
			return actor.RestartDirective
		}
		return actor.StopDirective
	})
	return s
}

func (s *jobStrategy) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID,
	rs *actor.RestartStatistics, reason interface{}, message interface{}) {
	s.mu.Lock()
	s.reasons[child.Id] = fmt.Sprintf("%v (while handling %T)", reason, message)
	s.mu.Unlock()
	s.inner.HandleFailure(sys, sup, child, rs, reason, message)
}

// takeReason returns and forgets why child failed ("" if it never did).
func (s *jobStrategy) takeReason(child *actor.PID) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.reasons[child.Id]
	delete(s.reasons, child.Id)
	return r
}
