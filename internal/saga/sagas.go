package saga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/safety"
)

// Defaults for Config fields left zero.
const (
	// StepBudgetDefault is how long a rollback waits for one compensation
	// to reach a terminal state before recording it timed out and moving on.
	StepBudgetDefault = 30 * time.Second
	// PollDefault is how often the trigger poller scans the trigger sets.
	PollDefault = time.Second
	// LockTTLDefault is the workflow saga lock's TTL; it is renewed every
	// third of it while the rollback works, so a dead replica's rollback is
	// taken over at most this long after it died.
	LockTTLDefault = 2 * time.Minute
	// JobPollDefault is how often a compensation job's state is read while
	// the rollback waits for it: 10 reads a second for one job of a rare
	// event is cheap, and keeps the rollback's step latency low.
	JobPollDefault = 100 * time.Millisecond
	// PolicyTimeoutDefault bounds the soft safety check; past it the
	// compensation proceeds (a rollback must not stall on the kernel).
	PolicyTimeoutDefault = 5 * time.Second
	// PerShardDefault bounds the workflows read from one shard's trigger
	// set per poll, so a burst of failures is started at a bounded rate.
	PerShardDefault = 100
	// RetentionDefault is how long a workflow's saga keys (stacks,
	// compensation templates, trigger entries, rollback progress) are kept
	// after the workflow's last recorded step on the key's shard, or after
	// its rollback's last run. It bounds how long after a step its
	// compensation can still run, and so should exceed the longest a
	// workflow runs.
	RetentionDefault = 7 * 24 * time.Hour
)

const (
	// publishTimeout bounds one JetStream publish of a compensation.
	publishTimeout = 5 * time.Second
	// releaseTimeout bounds giving a lock back on the way out.
	releaseTimeout = 2 * time.Second
	// redisTimeout bounds one bookkeeping round trip.
	redisTimeout = 5 * time.Second
)

// ErrConfig is wrapped by every configuration error Start returns.
var ErrConfig = errors.New("saga: invalid config")

// Config configures the saga runner of one node.
type Config struct {
	// System is the node's actor system; the runner spawns its supervisor
	// ("saga") at its root and one child per workflow ("saga/<workflow_id>").
	System *actor.ActorSystem
	// Store is the node's job store (Redis client, key names, DLQ).
	Store *store.Store
	// JS publishes compensations on Subjects.Submit.
	JS       jetstream.JetStream
	Subjects bus.Subjects
	// Policy is asked before each compensation (a soft check: DENY skips
	// it, an error or a timeout lets it proceed). Nil skips the check.
	Policy safety.InputPolicy
	// NodeID names this replica in locks and progress.
	NodeID string
	// Metrics is where the troupe_saga_* series are registered (nil: not
	// exported).
	Metrics prometheus.Registerer
	// Log receives the runner's logs (default slog.Default()).
	Log *slog.Logger
	// StepBudget is the per-compensation wait (default StepBudgetDefault).
	StepBudget time.Duration
	// Poll is the trigger poller's interval (default PollDefault).
	Poll time.Duration
	// LockTTL is the workflow saga lock's TTL (default LockTTLDefault).
	LockTTL time.Duration
	// JobPoll is how often a compensation's state is read (default JobPollDefault).
	JobPoll time.Duration
	// PolicyTimeout bounds the soft safety check (default PolicyTimeoutDefault).
	PolicyTimeout time.Duration
	// PerShard bounds workflows started per shard per poll (default PerShardDefault).
	PerShard int
	// Retention is how long a rollback keeps its workflow's saga keys
	// after it ran (default RetentionDefault); the nodes that record steps
	// should use the same (troupe.Config.Tuning.SagaRetention).
	Retention time.Duration
}

func (c *Config) validate() error {
	switch {
	case c.System == nil:
		return fmt.Errorf("%w: System is required", ErrConfig)
	case c.Store == nil:
		return fmt.Errorf("%w: Store is required", ErrConfig)
	case c.JS == nil:
		return fmt.Errorf("%w: JS is required", ErrConfig)
	case c.Subjects.Submit == "":
		return fmt.Errorf("%w: Subjects is required", ErrConfig)
	case c.NodeID == "":
		return fmt.Errorf("%w: NodeID is required", ErrConfig)
	}
	return nil
}

func (c *Config) applyDefaults() {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.StepBudget <= 0 {
		c.StepBudget = StepBudgetDefault
	}
	if c.Poll <= 0 {
		c.Poll = PollDefault
	}
	if c.LockTTL <= 0 {
		c.LockTTL = LockTTLDefault
	}
	if c.JobPoll <= 0 {
		c.JobPoll = JobPollDefault
	}
	if c.PolicyTimeout <= 0 {
		c.PolicyTimeout = PolicyTimeoutDefault
	}
	if c.PerShard <= 0 {
		c.PerShard = PerShardDefault
	}
	c.Retention = retentionOr(c.Retention)
}

// runtime is what every saga actor and rollback shares. Immutable after
// Start, except wg (safe for concurrent use).
type runtime struct {
	cfg Config
	m   *metrics
	// wg counts running rollback goroutines, so Stop returns only once
	// each has given its lock back.
	wg sync.WaitGroup
}

// Sagas is a node's saga runner: the trigger poller and the saga
// supervisor with its per-workflow actors.
//
// What it promises: a workflow in a trigger set is rolled back by one
// replica at a time (the workflow's saga lock); each step's compensation is
// submitted at most once as a job (a deterministic job id, and the
// progress hash written before and after each dispatch), newest step
// first; a rollback stopped midway — by Stop, a crash, a lost lock — is
// resumed by whichever replica's poller sees the trigger next, from the
// progress hash. What it never does: wait on the network inside an actor's
// mailbox, or dispatch a compensation the safety policy denied.
type Sagas struct {
	rt     *runtime
	sup    *actor.PID
	poller *poller
	stop   sync.Once
}

// Start spawns the saga supervisor and starts the trigger poller.
func Start(cfg Config) (*Sagas, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.applyDefaults()
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	rt := &runtime{cfg: cfg, m: m}
	sup, err := cfg.System.Root.SpawnNamed(supervisorProps(rt), SupervisorName)
	if err != nil {
		return nil, fmt.Errorf("saga: spawn supervisor: %w", err)
	}
	s := &Sagas{rt: rt, sup: sup}
	s.poller = newPoller(rt, func(wf string, upTo int64) {
		cfg.System.Root.Send(sup, &trigger{workflowID: wf, upToMs: upTo})
	})
	s.poller.start()
	return s, nil
}

// Stop stops the poller, then every saga actor, and waits (bounded by ctx)
// until each running rollback has stopped and given its lock back. A
// rollback stopped midway is resumed by the next poller to see its trigger.
func (s *Sagas) Stop(ctx context.Context) error {
	var err error
	s.stop.Do(func() {
		s.poller.shutdown()
		if e := s.rt.cfg.System.Root.StopFuture(s.sup).Wait(); e != nil {
			err = fmt.Errorf("saga: stop supervisor: %w", e)
		}
		done := make(chan struct{})
		go func() { s.rt.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			err = errors.Join(err, fmt.Errorf("saga: rollbacks still stopping: %w", ctx.Err()))
		}
	})
	return err
}
