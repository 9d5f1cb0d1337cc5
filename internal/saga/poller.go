package saga

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/store"
)

// poller finds workflows to roll back: every Poll it reads the 64 shards'
// trigger sets in one pipeline and delivers each workflow to the saga
// supervisor. While its polls find none the interval doubles, up to
// IdleFactor × Poll (a rollback then starts up to 4 s after its trigger
// rather than 1 s: 16 reads a second instead of 64 on an idle cluster), and
// a poll that delivers brings it back to Poll. One replica polls at a time
// (a TTL lock renewed every tick, three of its longest intervals), like the
// due poller; the saga lock per workflow is
// what actually keeps two replicas from running one rollback, so a brief
// overlap of two pollers after a failover only costs a few ignored
// deliveries.
type poller struct {
	// Immutable after construction.
	rt      *runtime
	deliver func(workflowID string, upToMs int64)
	token   string
	// Owned by the poll goroutine.
	stop, done chan struct{}
}

func newPoller(rt *runtime, deliver func(string, int64)) *poller {
	return &poller{rt: rt, deliver: deliver, token: lockToken(rt.cfg.NodeID),
		stop: make(chan struct{}), done: make(chan struct{})}
}

func (p *poller) lockKey() string { return p.rt.cfg.Store.Keys().Prefix() + "lock:saga-poller" }

func (p *poller) start() { go p.loop() }

// shutdown ends polling and gives the poller lock back, so another
// replica's poller takes over at its next tick rather than after the TTL.
func (p *poller) shutdown() {
	close(p.stop)
	<-p.done
	releaseLock(p.rt.cfg.Store.Client(), p.lockKey(), p.token)
}

// IdleFactor is the trigger poller's longest interval, in Polls, while its
// polls find nothing.
const IdleFactor = 4

func (p *poller) loop() {
	defer close(p.done)
	interval := p.rt.cfg.Poll
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			if p.tick() > 0 {
				interval = p.rt.cfg.Poll
			} else {
				interval = min(2*interval, IdleFactor*p.rt.cfg.Poll)
			}
			t.Reset(interval)
		}
	}
}

// tick polls once if this replica holds the poller lock, and returns how
// many workflows it delivered.
func (p *poller) tick() int {
	ctx, cancel := context.WithTimeout(context.Background(), p.rt.cfg.Poll)
	defer cancel()
	rdb, keys := p.rt.cfg.Store.Client(), p.rt.cfg.Store.Keys()
	if ok, err := takeLock(ctx, rdb, p.lockKey(), p.token, 3*IdleFactor*p.rt.cfg.Poll); err != nil || !ok {
		return 0
	}
	pipe := rdb.Pipeline()
	cmds := make([]*redis.ZSliceCmd, store.Shards)
	for i := range cmds {
		// Oldest trigger first: a backlog is worked off in failure order.
		cmds[i] = pipe.ZRangeWithScores(ctx, TriggersKey(keys, i), 0, int64(p.rt.cfg.PerShard-1))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		p.rt.cfg.Log.Warn("saga: trigger poll failed", "err", err)
		return 0
	}
	// A workflow whose steps live on several shards may be triggered on
	// more than one; it is delivered once, with its newest trigger.
	upTo := map[string]int64{}
	for _, c := range cmds {
		for _, z := range c.Val() {
			wf, _ := z.Member.(string)
			if cur, ok := upTo[wf]; !ok || int64(z.Score) > cur {
				upTo[wf] = int64(z.Score)
			}
		}
	}
	for wf, s := range upTo {
		p.deliver(wf, s)
	}
	return len(upTo)
}
