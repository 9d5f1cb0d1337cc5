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
	// Every is the poll interval while ticks find work (default
	// DuePollDefault).
	Every time.Duration
	// IdleEvery is the longest interval between ticks while they find
	// nothing: each tick that wakes no job doubles the interval, from
	// Every up to IdleEvery, and a tick that wakes one (or a Poke) brings
	// it back to Every. A due time written by another replica is so seen
	// up to IdleEvery + Slack late (default DueIdleFactor × Every;
	// negative or at most Every: no backoff).
	IdleEvery time.Duration
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

	stop chan struct{}
	done chan struct{}
	poke chan struct{} // Poke's signal to the loop (buffered 1)
	// Owned by the tick (the loop's goroutine, or a test's).
	lastHousekeep time.Time

	adopted  atomic.Int64 // parked jobs of dead nodes woken for adoption
	interval atomic.Int64 // the loop's present interval (ns), for Interval
}

// Interval returns the time the running poller waits between its present
// ticks: Every while they wake jobs, up to IdleEvery while they find
// nothing (zero before Start).
func (p *DuePoller) Interval() time.Duration { return time.Duration(p.interval.Load()) }

// DuePoller defaults.
const (
	DuePollDefault     = time.Second
	DueSlackDefault    = 2 * time.Second
	DuePerShardDefault = 64
	// DueRetryAfter is how long a woken job's due entry is pushed back, so a
	// wake that did not take (the owner is alive) is not repeated every tick.
	DueRetryAfter = 5 * time.Second
	// DueIdleFactor is the default IdleEvery in poll intervals: an idle
	// node ticks every 4 s instead of every second (a quarter of the
	// commands: each tick is ~130 scripts over the 64 shards on the lock
	// holder, 64 on every other replica), and a wait that another replica
	// parked comes back up to DueSlack + 4 s (6 s) late instead of 3 s.
	DueIdleFactor = 4
)

// idleEvery returns the longest idle interval (IdleEvery, its default, or
// Every when backoff is off).
func (p *DuePoller) idleEvery() time.Duration {
	switch {
	case p.IdleEvery == 0:
		return DueIdleFactor * p.every()
	case p.IdleEvery < p.every():
		return p.every()
	}
	return p.IdleEvery
}

// nextInterval returns the interval after a tick that woke woken jobs,
// given the one before it: back to Every after a wake, else doubled, up to
// idleEvery.
func (p *DuePoller) nextInterval(prev time.Duration, woken int) time.Duration {
	if woken > 0 {
		return p.every()
	}
	return min(2*prev, p.idleEvery())
}

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
	p.poke = make(chan struct{}, 1)
	go p.loop()
}

// Poke brings the poll interval back to Every from now: something this
// node wrote (a human decision) is due now, and is taken Slack later. It
// never blocks; before Start it does nothing.
func (p *DuePoller) Poke() {
	select {
	case p.poke <- struct{}{}:
	default:
	}
}

// Stop ends the poller and gives up its lock.
func (p *DuePoller) Stop() {
	close(p.stop)
	<-p.done
}

func (p *DuePoller) lockKey() string { return p.Store.Keys().Prefix() + "lock:due-poller" }

// loop ticks every interval: Every while ticks wake jobs, doubling up to
// idleEvery while they find nothing. An idle interval is a cost in wake
// latency only for what this node did not write itself (another replica's
// retry wait, a dead node's lease); a Poke ends the wait.
func (p *DuePoller) loop() {
	defer close(p.done)
	interval := p.Every
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		p.interval.Store(int64(interval))
		select {
		case <-p.stop:
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			// Only if still ours: a lapsed lock may be another's now.
			_, _ = store.ReleaseLease(ctx, p.Store.Client(), p.lockKey(), p.NodeID)
			cancel()
			return
		case <-p.poke:
			// What is due now is taken once Slack has passed: tick at
			// the busy pace from here (Go 1.23 timers: Reset drops a
			// pending tick).
			interval = p.Every
			t.Reset(interval)
		case <-t.C:
			interval = p.nextInterval(interval, p.Tick(context.Background()))
			t.Reset(interval)
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
	ctx, cancel := context.WithTimeout(ctx, max(p.every(), tickBudgetMin))
	defer cancel()
	now := time.Now()
	// Every node, lock or not: its own parked jobs whose deadline has come.
	own := p.wakeOwnParked(ctx, now)
	if !p.holdLock(ctx) {
		return own
	}
	if p.lastHousekeep.IsZero() {
		p.lastHousekeep = now // the first round a full period after the lock
	} else if now.Sub(p.lastHousekeep) >= TrimEvery*p.every() {
		// Housekeeping after this tick's wakes, on its own budget: the
		// tenant slot repair scans the keyspace, which with millions of
		// jobs takes longer than a tick. Timed, not counted in ticks: an
		// idle poller ticks less often.
		p.lastHousekeep = now
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

// every returns Every, or its default for a poller that was not started (a
// test's Tick).
func (p *DuePoller) every() time.Duration {
	if p.Every <= 0 {
		return DuePollDefault
	}
	return p.Every
}

// holdLock takes or extends the poller lock for three of its longest
// intervals (idle ones), in one owner-checked step (store.TakeLease): a
// poller whose lock lapsed and went to another replica never extends that
// replica's lock, and an idle holder's lock outlasts its wait.
func (p *DuePoller) holdLock(ctx context.Context) bool {
	ok, err := store.TakeLease(ctx, p.Store.Client(), p.lockKey(), p.NodeID, 3*p.idleEvery())
	if err != nil {
		p.Log.Warn("due poller lock not taken", "err", err)
		return false
	}
	return ok
}
