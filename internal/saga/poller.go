package saga

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/store"
)

// poller finds workflows to roll back: every Poll it reads the 64 shards'
// trigger sets in one pipeline and delivers each workflow to the saga
// supervisor. One replica polls at a time (a TTL lock renewed every tick,
// three ticks long), like the due poller; the saga lock per workflow is
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

func (p *poller) loop() {
	defer close(p.done)
	t := time.NewTicker(p.rt.cfg.Poll)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.tick()
		}
	}
}

// tick polls once if this replica holds the poller lock, and returns how
// many workflows it delivered.
func (p *poller) tick() int {
	ctx, cancel := context.WithTimeout(context.Background(), p.rt.cfg.Poll)
	defer cancel()
	rdb, keys := p.rt.cfg.Store.Client(), p.rt.cfg.Store.Keys()
	if ok, err := takeLock(ctx, rdb, p.lockKey(), p.token, 3*p.rt.cfg.Poll); err != nil || !ok {
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
