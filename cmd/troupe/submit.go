package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/proto/capv1"
)

// busPublishTimeout bounds one publish of `submit --bus`.
const busPublishTimeout = 10 * time.Second

// runSubmit is `troupe job submit`: through the admin API, or with --bus
// on sys.job.submit as any CAP client publishes.
func runSubmit(ctx context.Context, args []string) error {
	return stdCtl().run(ctx, append([]string{"job", "submit"}, args...))
}

// submitOnBus publishes req on the submit subject, signed with --sign-key
// when given, and waits for JetStream's ack (a node need not be up: the
// stream keeps the request until one takes it).
func submitOnBus(ctx context.Context, c *common, sf *signFlags, req *capv1.JobRequest) (admin.Submitted, error) {
	enc, err := sf.encoder()
	if err != nil {
		return admin.Submitted{}, err
	}
	if req.JobId == "" {
		req.JobId = newID("job-")
	}
	if req.ContextPtr == "" {
		req.ContextPtr = "redis://ctx:" + req.JobId
	}
	nc, err := c.dialNATS("troupe-submit")
	if err != nil {
		return admin.Submitted{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return admin.Submitted{}, err
	}
	data, err := enc.Request(req.JobId, sf.sender, req)
	if err != nil {
		return admin.Submitted{}, err
	}
	pctx, cancel := context.WithTimeout(ctx, busPublishTimeout)
	defer cancel()
	if _, err := js.Publish(pctx, bus.NewSubjects(c.subjPrefix).Submit, data); err != nil {
		return admin.Submitted{}, fmt.Errorf("publish (is a node running? it creates the streams): %w", err)
	}
	return admin.Submitted{JobID: req.JobId, Tenant: req.TenantId}, nil
}
