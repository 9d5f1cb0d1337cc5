package recovery

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// Intake is what recovery needs of the node's intake (*intake.Intake): a way
// to reach a job's actor through the job's shard. Recovery finds the jobs;
// it never routes a message itself.
type Intake interface {
	// Wake asks the job's actor (spawning it) to activate the job.
	Wake(jobID string)
	// WakeOrphan wakes a job whose owner's lock lapsed at lapsedAt.
	WakeOrphan(jobID string, lapsedAt time.Time)
	// RememberParked hands job ids to their shards' memory of jobs parked
	// here in DISPATCHED.
	RememberParked(jobIDs []string)
}

// DuePoller wakes jobs whose due time has passed without their owner acting:
// retries and deadlines of jobs whose node died, and approvals granted while
// the job waited with no actor. One replica polls at a time (a TTL lock), so
// a failover of many jobs is woken at a bounded rate — PerShard jobs per
// shard per tick — rather than all at once.
//
// Two more duties concern parked jobs (actors.JobActor.park), which wait in
// their node's parked sets rather than in the due set:
//   - every node, lock or not, wakes its own parked jobs whose deadline has
//     come (they have no actor, hence no timer);
//   - the lock holder adopts the parked jobs of dead nodes (a node lease
//     older than a lock TTL, or given up at a graceful stop), PerShard per
//     shard per tick over all dead nodes, and forgets a dead node once it
//     has none left.
type DuePoller struct {
	Store  *store.Store
	Intake Intake
	NodeID string
	Log    *slog.Logger
	// Every is the poll interval (default DuePollDefault).
	Every time.Duration
	// Slack lets a live owner act on its own timer first (default DueSlackDefault).
	Slack time.Duration
	// PerShard bounds jobs woken per shard per tick (default DuePerShardDefault).
	PerShard int
	// Stale, when set, receives per tick how many overdue jobs the poller
	// found in each state (troupe_stale_jobs{state}).
	Stale *prometheus.GaugeVec
	// Housekeep, when set, runs with the lock holder's housekeeping (the
	// concurrency key slots' repair).
	Housekeep func(ctx context.Context)

	stop  chan struct{}
	done  chan struct{}
	ticks int

	adopted atomic.Int64 // parked jobs of dead nodes woken for adoption
}

// DuePoller defaults.
const (
	DuePollDefault     = time.Second
	DueSlackDefault    = 2 * time.Second
	DuePerShardDefault = 64
	// DueRetryAfter is how long a woken job's due entry is pushed back, so a
	// wake that did not take (the owner is alive) is not repeated every tick.
	DueRetryAfter = 5 * time.Second
)

// Start runs the poller until Stop.
func (p *DuePoller) Start() {
	if p.Every <= 0 {
		p.Every = DuePollDefault
	}
	if p.Slack <= 0 {
		p.Slack = DueSlackDefault
	}
	if p.PerShard <= 0 {
		p.PerShard = DuePerShardDefault
	}
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	go p.loop()
}

// Stop ends the poller and gives up its lock.
func (p *DuePoller) Stop() {
	close(p.stop)
	<-p.done
}

func (p *DuePoller) lockKey() string { return p.Store.Keys().Prefix() + "lock:due-poller" }

func (p *DuePoller) loop() {
	defer close(p.done)
	t := time.NewTicker(p.Every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			// Only if still ours: a lapsed lock may be another's now.
			_, _ = store.ReleaseLease(ctx, p.Store.Client(), p.lockKey(), p.NodeID)
			cancel()
			return
		case <-t.C:
			p.Tick(context.Background())
		}
	}
}

// tickBudgetMin is the least time a tick may take before its reads are
// given up (see Tick).
const tickBudgetMin = time.Second

// Tick polls once (if this replica holds the poller lock) and returns how
// many jobs it woke.
func (p *DuePoller) Tick(ctx context.Context) int {
	// The tick's budget is its interval, at least tickBudgetMin: a tick
	// reads every shard several times over, and a short interval's budget
	// (50 ms in tests) ran out before a dead node's last step (its
	// forgetting) on a slow machine's embedded store, every tick.
	ctx, cancel := context.WithTimeout(ctx, max(p.Every, tickBudgetMin))
	defer cancel()
	now := time.Now()
	// Every node, lock or not: its own parked jobs whose deadline has come.
	own := p.wakeOwnParked(ctx, now)
	if !p.holdLock(ctx) {
		return own
	}
	if p.ticks++; p.ticks%TrimEvery == 0 {
		// Housekeeping after this tick's wakes, on its own budget: the
		// tenant slot repair scans the keyspace, which with millions of
		// jobs takes longer than a tick.
		defer p.housekeep(now)
	}
	ids, err := p.Store.DueJobs(ctx, now.Add(-p.Slack), now.Add(DueRetryAfter), p.PerShard)
	if err != nil {
		p.Log.Warn("due poll failed", "err", err)
		return 0
	}
	// Both sets are read before any wake, so a job in both is found by both.
	orphans := p.orphanLeases(ctx, now)
	for _, id := range ids {
		p.Intake.Wake(id)
	}
	ids = p.wakeOrphans(orphans, ids)
	for _, id := range p.adoptDeadNodes(ctx, now) {
		p.Intake.Wake(id)
		ids = append(ids, id)
	}
	p.countStale(ctx, ids)
	if len(ids) > 0 {
		p.Log.Debug("due jobs woken", "count", len(ids))
	}
	return len(ids) + own
}

// countStale sets troupe_stale_jobs{state} to the states of the jobs this
// tick found overdue (one pipelined read; ids is bounded by PerShard).
func (p *DuePoller) countStale(ctx context.Context, ids []string) {
	if p.Stale == nil {
		return
	}
	counts := map[jobstate.State]float64{}
	if len(ids) > 0 {
		pipe := p.Store.Client().Pipeline()
		cmds := make([]*redis.StringCmd, len(ids))
		for i, id := range ids {
			cmds[i] = pipe.HGet(ctx, p.Store.Keys().Job(id), "s")
		}
		_, _ = pipe.Exec(ctx)
		for _, c := range cmds {
			if st := jobstate.State(c.Val()); st.Valid() {
				counts[st]++
			}
		}
	}
	for _, st := range jobstate.AllStates {
		if !st.Terminal() {
			p.Stale.WithLabelValues(string(st)).Set(counts[st])
		}
	}
}

// holdLock takes or extends the poller lock for three poll intervals, in
// one owner-checked step (store.TakeLease): a poller whose lock lapsed and
// went to another replica never extends that replica's lock.
func (p *DuePoller) holdLock(ctx context.Context) bool {
	ok, err := store.TakeLease(ctx, p.Store.Client(), p.lockKey(), p.NodeID, 3*p.Every)
	if err != nil {
		p.Log.Warn("due poller lock not taken", "err", err)
		return false
	}
	return ok
}
