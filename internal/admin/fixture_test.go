package admin_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/internal/testhook"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// *troupe.Node is the admin server's node.
var _ admin.Node = inspect.Of((*troupe.Node)(nil))

// Keys of the test servers that use authentication.
const (
	keyAll = "all-tenants-key-0123456789"
	keyA   = "tenant-a-key-0123456789ab"
	keyB   = "tenant-b-key-0123456789ab"
)

var testKeys = map[string]string{keyAll: admin.AllTenants, keyA: "a", keyB: "b"}

// The routing the tests use (as node_test.go's fixture).
const testPools = `
topics:
  job.echo: echo
pools:
  echo: {requires: []}
`

func newRegistry() *prometheus.Registry { return prometheus.NewRegistry() }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// options shape one fixture.
type options struct {
	keys    map[string]string
	admin   func(*admin.Config) // changes to the server's config
	node    func(*troupe.Config)
	proxied bool // the node reaches Redis through a proxy the test can cut
}

// bundle is one test's node, admin server and clients.
type bundle struct {
	t     *testing.T
	env   *testenv.Env
	node  *troupe.Node
	srv   *admin.Server
	base  string
	proxy *tcpProxy
}

func setup(t *testing.T, o options) *bundle {
	t.Helper()
	env := testenv.New(t)
	pools, err := troupe.ParsePools([]byte(testPools))
	if err != nil {
		t.Fatal(err)
	}
	cfg := troupe.Config{
		NodeID: "node-a", NATSURL: env.NATSURL, RedisURL: env.RedisURL,
		KeyPrefix: env.KeyPrefix(), SubjectPrefix: env.Prefix, StreamPrefix: env.StreamPrefix(),
		Pools: pools, Tuning: troupe.Tuning{PermanentGrace: 100 * time.Millisecond}, Logger: quiet(),
	}
	testhook.SetBackoff(&cfg, func(int) time.Duration { return 50 * time.Millisecond })
	b := &bundle{t: t, env: env}
	if o.proxied {
		b.proxy = startProxy(t, env.Redis.Options().Addr)
		rdb := redis.NewClient(&redis.Options{Addr: b.proxy.addr, DialTimeout: 300 * time.Millisecond,
			ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		cfg.Redis = rdb
	}
	if o.node != nil {
		o.node(&cfg)
	}
	node, err := troupe.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	b.node = node
	acfg := admin.Config{Node: inspect.Of(node), Registry: node.Metrics(), Listen: "127.0.0.1:0",
		APIKeys: o.keys, Log: quiet(), SampleEvery: 250 * time.Millisecond}
	if o.admin != nil {
		o.admin(&acfg)
	}
	srv, err := admin.NewServer(acfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	b.srv, b.base = srv, "http://"+srv.Addr()
	return b
}

func (b *bundle) client(key string) *admin.Client { return admin.NewClient(b.base, key) }

// startWorker starts a CAP worker in pool echo and waits until the router
// knows it.
func (b *bundle) startWorker(id string, h worker.Handler) {
	b.t.Helper()
	w, err := worker.Start(b.env.NATS, worker.Config{ID: id, Pool: "echo", Topics: []string{"job.echo"}, Direct: true,
		SubjectPrefix: inspect.Of(b.node).Subjects().Prefix(), Handler: h, Heartbeat: time.Second, MaxParallel: 4})
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(w.Stop)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if ws, err := inspect.Of(b.node).Workers(); err == nil {
			for _, x := range ws {
				if x.ID == id {
					return
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.t.Fatalf("router never saw worker %s", id)
}

// waitState polls the API until the job is in want.
func (b *bundle) waitState(c *admin.Client, id, want string) admin.Job {
	b.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var last admin.Job
	var lastErr error
	for time.Now().Before(deadline) {
		j, err := c.Job(context.Background(), id)
		if err == nil {
			last = j
			if j.State == want {
				return j
			}
		}
		lastErr = err
		time.Sleep(20 * time.Millisecond)
	}
	b.t.Fatalf("job %s: state %q (err %v), want %s; history %+v", id, last.State, lastErr, want, last.History)
	return admin.Job{}
}

func echoReq(id, tenant string) *capv1.JobRequest {
	return &capv1.JobRequest{JobId: id, Topic: "job.echo", ContextPtr: "redis://ctx:" + id, TenantId: tenant}
}

// hang holds a job until the worker stops.
func hang(ctx context.Context, _ *capv1.JobRequest) *capv1.JobResult {
	<-ctx.Done()
	return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_CANCELLED}
}

// labelPolicy decides by the job's "cordum.policy" label: deny, approve (a
// human decides) or anything else → allow.
type labelPolicy struct{}

func (labelPolicy) Check(_ context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	switch req.Labels["cordum.policy"] {
	case "deny":
		return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_DENY, Reason: "no", RuleId: "r-deny"}, nil
	case "approve":
		return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN, Reason: "ask", RuleId: "r-human"}, nil
	}
	return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}, nil
}

// apiStatus returns the HTTP status of an API error (0 for nil, -1 for a
// transport error).
func apiStatus(err error) int {
	if err == nil {
		return 0
	}
	var ae *admin.APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return -1
}

// tcpProxy forwards connections to a target until cut, the way a network
// partition or a dead Redis looks to the node.
type tcpProxy struct {
	t      *testing.T
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns []net.Conn
}

func startProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	p := &tcpProxy{t: t, target: target}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.cut)
	return p
}

func (p *tcpProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
}

// cut closes the listener and every connection: new dials are refused.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// restore listens again on the same address.
func (p *tcpProxy) restore() {
	p.t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.serve(ln)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.t.Fatalf("proxy: listen again on %s: %v", p.addr, err)
}
