package main

import (
	"context"
	"flag"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/safety"
)

func runNode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("node", flag.ExitOnError)
	var c common
	c.register(fs, true, true)
	id := fs.String("id", envOr("TROUPE_NODE_ID", ""), "node id (default hostname-pid)")
	poolsFile := fs.String("pools", envOr("TROUPE_POOLS_FILE", ""), "pools.yaml (default: built-in routing for job.echo, job.sleep, job.bench)")
	timeouts := fs.String("timeouts", envOr("TROUPE_TIMEOUTS_FILE", ""), "timeouts.yaml (default: dispatch 300 s, running 9000 s)")
	var approve, deny listFlag
	fs.Var(&approve, "approve-topic", "topic pattern whose jobs need a human approval (repeatable; until the policy engine lands)")
	fs.Var(&deny, "deny-topic", "topic pattern whose jobs are denied (repeatable)")
	_ = fs.Parse(args)
	log := c.logger()
	pools, err := loadPools(*poolsFile)
	if err != nil {
		return err
	}
	node, err := troupe.NewNode(troupe.Config{NodeID: *id, NATSURL: c.nats, RedisURL: c.redis,
		KeyPrefix: c.keyPrefix, SubjectPrefix: c.subjPrefix, StreamPrefix: c.streamPrefix, Pools: pools, TimeoutsFile: *timeouts, Logger: log,
		Policy: safety.TopicRules{Approve: approve, Deny: deny}})
	if err != nil {
		return err
	}
	if err := node.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return node.Stop(sctx)
}
