package router

import (
	"context"
	"fmt"
	"maps"
)

// Pausing a topic: its jobs are not dispatched. Strategy.route answers
// pool_paused (Waitable), so a job asking for a worker waits in its pools'
// queues, in order, and its actor records it SCHEDULED pool_paused: visible,
// cancellable, never failed for the wait. The paused set lives in Redis next
// to the runtime mappings and bumps their version, so every replica's
// PoolsWatcher applies a pause or a resume within PoolsPollDefault, and a
// restarted replica starts with it. A resume's new config drains the queues
// (SetPools), so the waiting jobs are placed in their queue order.

// Pause stops dispatching topic's jobs on every replica until Resume.
func (s *MappingStore) Pause(ctx context.Context, topic string) error {
	return s.setPaused(ctx, topic, true)
}

// Resume lets topic's jobs be dispatched again.
func (s *MappingStore) Resume(ctx context.Context, topic string) error {
	return s.setPaused(ctx, topic, false)
}

func (s *MappingStore) setPaused(ctx context.Context, topic string, paused bool) error {
	if err := validMapping(topic, []string{"-"}); err != nil {
		return err
	}
	pipe := s.rdb.TxPipeline()
	if paused {
		pipe.SAdd(ctx, s.pausedKey, topic)
	} else {
		pipe.SRem(ctx, s.pausedKey, topic)
	}
	pipe.Incr(ctx, s.versionKey)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("router: pause %s (%v): %w", topic, paused, err)
	}
	return nil
}

// WithPaused returns a copy of c with the given topics paused (c itself
// when there are none and c pauses none).
func (c *PoolConfig) WithPaused(paused map[string]bool) *PoolConfig {
	if len(paused) == 0 && len(c.Paused) == 0 {
		return c
	}
	out := *c
	out.Paused = make(map[string]bool, len(paused))
	maps.Copy(out.Paused, paused)
	return &out
}
