package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/bus"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/store"
)

func runSubmit(ctx context.Context, args []string) error {
	fs := newFlags("submit")
	var c common
	c.register(fs, true, true)
	topic := fs.String("topic", "job.echo", "job topic")
	id := fs.String("id", "", "job id (default job-<random>)")
	ctxPtr := fs.String("context-ptr", "", "context pointer (default redis://ctx:<job_id>)")
	tenant := fs.String("tenant", "", "tenant id")
	wait := fs.Bool("wait", false, "wait until the job is terminal and print it (reads Redis)")
	timeout := fs.Duration("timeout", 60*time.Second, "how long --wait waits")
	labels := labelsFlag{}
	fs.Var(labels, "label", "job label key=value (repeatable)")
	var sf signFlags
	sf.registerCLI(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	enc, err := sf.encoder()
	if err != nil {
		return err
	}
	if *id == "" {
		*id = newID("job-")
	}
	if *ctxPtr == "" {
		*ctxPtr = "redis://ctx:" + *id
	}
	nc, err := c.dialNATS("troupe-submit")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	req := &capv1.JobRequest{JobId: *id, Topic: *topic, ContextPtr: *ctxPtr, TenantId: *tenant, Labels: labels}
	data, err := enc.Request(*id, sf.sender, req)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ack, err := js.Publish(pctx, bus.NewSubjects(c.subjPrefix).Submit, data)
	if err != nil {
		return fmt.Errorf("publish (is a node running? it creates the streams): %w", err)
	}
	fmt.Printf("submitted %s (topic %s, stream %s seq %d)\n", *id, *topic, ack.Stream, ack.Sequence)
	if !*wait {
		return nil
	}
	st, closeFn, err := openStore(c)
	if err != nil {
		return err
	}
	defer closeFn()
	rec, err := waitTerminal(ctx, st, *id, *timeout)
	if rec != nil {
		printJob(os.Stdout, rec)
	}
	return err
}

func openStore(c common) (*store.Store, func(), error) {
	rdb, err := c.dialRedis(context.Background())
	if err != nil {
		return nil, nil, err
	}
	return store.New(rdb, store.Config{Prefix: c.keyPrefix}), func() { _ = rdb.Close() }, nil
}
