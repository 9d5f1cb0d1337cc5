package troupe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/internal/jobdata"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/signing"
)

// Defaults for ClientConfig fields left zero.
const (
	// clientSenderDefault is the sender id of a Client's packets.
	clientSenderDefault = "troupe-client"
	// clientWaitPollDefault is how often Client.Wait reads a job's record:
	// one HGETALL per waiting call, cheap enough at 10 a second.
	clientWaitPollDefault = 100 * time.Millisecond
)

// ClientConfig configures a Client. Its addresses, prefixes and
// credentials are those of the nodes it talks to.
type ClientConfig struct {
	// NATSURL, NATSAuth and NATS are as in Config (default TROUPE_NATS_URL,
	// then nats://127.0.0.1:4222).
	NATSURL  string
	NATSAuth NATSAuth
	NATS     *nats.Conn
	// RedisURL, RedisAuth and Redis are as in Config (default
	// TROUPE_REDIS_URL, then redis://127.0.0.1:6379).
	RedisURL  string
	RedisAuth RedisAuth
	Redis     redis.UniversalClient
	// KeyPrefix and SubjectPrefix must match the nodes' (defaults as in
	// Config).
	KeyPrefix     string
	SubjectPrefix string
	// Sender is the sender id of the client's packets (default
	// clientSenderDefault); Signer, when set, signs them under it.
	Sender string
	Signer *signing.Signer
	// WaitPoll is how often Wait and Watch read a job's record (default
	// clientWaitPollDefault).
	WaitPoll time.Duration
	// MaxPayloadBytes bounds a payload SubmitPayload stores (default
	// jobdata.MaxBytesDefault); DataTTL is its expiry (default
	// jobdata.TTLDefault, twice the default retention; negative: none).
	MaxPayloadBytes int64
	DataTTL         time.Duration
}

// Client submits, cancels, waits for and lists jobs and runs no scheduler:
// it publishes CAP packets on the nodes' JetStream subjects, as any CAP
// client does, and reads the job records the nodes keep in Redis. A
// program that hands work to a cluster of nodes needs only this. It is
// safe for concurrent use.
//
//	c, err := troupe.NewClient(ctx, troupe.ClientConfig{NATSURL: natsURL, RedisURL: redisURL})
//	if err != nil { ... }
//	defer c.Close()
//	_ = c.Submit(ctx, &capv1.JobRequest{JobId: "hello-1", Topic: "job.echo"})
//	rec, err := c.Wait(ctx, "hello-1")
type Client struct {
	// Immutable after NewClient.
	cfg ClientConfig
	nc  *nats.Conn
	js  jetstream.JetStream
	// batchJS is SubmitBatch's: its own async publish window and ack timeout.
	batchJS jetstream.JetStream
	rdb     redis.UniversalClient
	store   *store.Store
	data    *jobdata.Store
	subj    bus.Subjects
	enc     bus.Encoder
	ownNC   bool
	ownRDB  bool
}

// NewClient connects to NATS and Redis (or takes the connections given).
func NewClient(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if cfg.NATSURL == "" {
		cfg.NATSURL = envOr("TROUPE_NATS_URL", nats.DefaultURL)
	}
	if cfg.RedisURL == "" {
		cfg.RedisURL = envOr("TROUPE_REDIS_URL", connect.RedisURLDefault)
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = KeyPrefixDefault
	}
	if cfg.Sender == "" {
		cfg.Sender = clientSenderDefault
	}
	if cfg.WaitPoll <= 0 {
		cfg.WaitPoll = clientWaitPollDefault
	}
	c := &Client{cfg: cfg, subj: bus.NewSubjects(cfg.SubjectPrefix)}
	if cfg.Signer != nil {
		// Only a real signer: a nil *Signer in the interface would be called.
		c.enc.Signer = cfg.Signer
	}
	c.nc = cfg.NATS
	if c.nc == nil {
		nc, err := connect.DialNATS(cfg.NATSURL, cfg.NATSAuth.conn(), nats.Name("troupe-client "+cfg.Sender))
		if err != nil {
			return nil, fmt.Errorf("troupe: client: %w", err)
		}
		c.nc, c.ownNC = nc, true
	}
	js, err := jetstream.New(c.nc)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("troupe: client: jetstream: %w", err)
	}
	c.js = js
	if c.batchJS, err = jetstream.New(c.nc, jetstream.WithPublishAsyncMaxPending(64*submitBatchWindow),
		jetstream.WithPublishAsyncTimeout(submitBatchAckWait)); err != nil {
		c.Close()
		return nil, fmt.Errorf("troupe: client: jetstream: %w", err)
	}
	c.rdb = cfg.Redis
	if c.rdb == nil {
		rdb, err := connect.DialRedis(ctx, cfg.RedisURL, cfg.RedisAuth.conn())
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("troupe: client: %w", err)
		}
		c.rdb, c.ownRDB = rdb, true
	}
	c.store = store.New(c.rdb, store.Config{Prefix: cfg.KeyPrefix})
	c.data = &jobdata.Store{Client: c.rdb, MaxBytes: cfg.MaxPayloadBytes, TTL: cfg.DataTTL}
	return c, nil
}

// Close closes the connections the client dialed (not those it was given).
func (c *Client) Close() {
	if c.ownNC && c.nc != nil {
		c.nc.Close()
	}
	if c.ownRDB && c.rdb != nil {
		_ = c.rdb.Close()
	}
}

// Submit publishes req on the submit subject and returns once JetStream
// has it (a node takes it from there, now or when one starts; a node
// creates the streams, so one must have run once).
func (c *Client) Submit(ctx context.Context, req *capv1.JobRequest) error {
	if req.GetJobId() == "" {
		return errors.New("troupe: client: submit needs a job id")
	}
	data, err := c.enc.Request(req.JobId, c.cfg.Sender, req)
	if err != nil {
		return fmt.Errorf("troupe: client: %w", err)
	}
	if _, err := c.js.Publish(ctx, c.subj.Submit, data); err != nil {
		return fmt.Errorf("troupe: client: submit %s: %w", req.JobId, err)
	}
	return nil
}

// submitBatchWindow bounds the publishes of one SubmitBatch awaiting their
// JetStream ack at once; submitBatchAckWait bounds the wait for one ack.
const (
	submitBatchWindow  = 1024
	submitBatchAckWait = 10 * time.Second
)

// SubmitBatch submits many jobs at once: each request goes out as its own
// packet on the submit subject, exactly as Submit sends it (a node, or any
// CAP consumer, sees N ordinary submits), but the publishes are pipelined
// and the call waits once for all their JetStream acks instead of once per
// job. It returns nil when JetStream has every job; otherwise an error
// joining one error per job that was not submitted (a request with no job
// id, one that does not encode, one whose publish failed), each naming the
// job's index and id — the other jobs are submitted regardless. Sending a
// batch again is safe: a node creates each job id once.
func (c *Client) SubmitBatch(ctx context.Context, reqs []*capv1.JobRequest) error {
	type sent struct {
		i   int
		ack jetstream.PubAckFuture
	}
	var errs []error
	fail := func(i int, id string, err error) {
		errs = append(errs, fmt.Errorf("troupe: client: batch item %d (job %q): %w", i, id, err))
	}
	window := make([]sent, 0, min(len(reqs), submitBatchWindow))
	drain := func() {
		for _, s := range window {
			select {
			case <-s.ack.Ok():
			case err := <-s.ack.Err():
				fail(s.i, reqs[s.i].GetJobId(), err)
			case <-ctx.Done():
				fail(s.i, reqs[s.i].GetJobId(), ctx.Err())
			}
		}
		window = window[:0]
	}
	for i, req := range reqs {
		if req.GetJobId() == "" {
			fail(i, "", errors.New("no job id"))
			continue
		}
		if ctx.Err() != nil {
			fail(i, req.JobId, ctx.Err())
			continue
		}
		data, err := c.enc.Request(req.JobId, c.cfg.Sender, req)
		if err != nil {
			fail(i, req.JobId, err)
			continue
		}
		ack, err := c.batchJS.PublishAsync(c.subj.Submit, data)
		if err != nil {
			fail(i, req.JobId, err)
			continue
		}
		if window = append(window, sent{i: i, ack: ack}); len(window) == submitBatchWindow {
			drain()
		}
	}
	drain()
	return errors.Join(errs...)
}

// Cancel publishes a JobCancel for jobID (JetStream, so a node takes it
// even when it comes before the job does).
func (c *Client) Cancel(ctx context.Context, jobID, reason, by string) error {
	data, err := c.enc.Cancel(jobID, c.cfg.Sender, &capv1.JobCancel{JobId: jobID, Reason: reason, RequestedBy: by})
	if err != nil {
		return fmt.Errorf("troupe: client: %w", err)
	}
	if _, err := c.js.Publish(ctx, c.subj.Cancel, data); err != nil {
		return fmt.Errorf("troupe: client: cancel %s: %w", jobID, err)
	}
	return nil
}

// Job reads a job's record and history (ErrNotFound: no record yet, or no
// longer: see Config.Retention).
func (c *Client) Job(ctx context.Context, jobID string) (*Job, error) {
	rec, err := c.store.GetJob(ctx, jobID)
	return jobOf(rec), err
}

// Wait returns jobID's record once the job is terminal, or ctx's error. A
// job with no record yet (not taken by a node, or waiting unwritten for
// capacity) is waited for too.
func (c *Client) Wait(ctx context.Context, jobID string) (*Job, error) {
	t := time.NewTicker(c.cfg.WaitPoll)
	defer t.Stop()
	for {
		rec, err := c.store.GetJob(ctx, jobID)
		switch {
		case err == nil && rec.State.Terminal():
			return jobOf(rec), nil
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}
