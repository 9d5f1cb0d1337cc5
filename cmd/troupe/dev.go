package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/internal/embedded"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/worker"
)

func runDev(ctx context.Context, args []string) error {
	fs := newFlags("dev")
	var c common
	c.register(fs, false, false)
	jobs := fs.Int("jobs", 5, "demo jobs to submit")
	exit := fs.Bool("exit", false, "exit after the demo jobs finish instead of serving until interrupted")
	poolsFile := fs.String("pools", "", "pools.yaml (default: the built-in demo routing)")
	otlp := fs.String("otlp-endpoint", "", "OTLP/gRPC receiver for job traces: host:port or http://host:port (plaintext), https://host:port (TLS) (default OTEL_EXPORTER_OTLP_ENDPOINT; neither: tracing off)")
	var af adminFlags
	af.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if c.logLevel == "info" {
		c.logLevel = "warn" // the demo prints job paths; keep the log quiet
	}
	log := c.logger()
	otelErrorsTo(log)

	fmt.Println("troupe dev: starting embedded NATS (JetStream) and an embedded Redis-protocol store…")
	ns, err := devStart(devNATSAddr, embedded.StartNATSAt)
	if err != nil {
		return err
	}
	defer ns.Stop()
	rs, err := devStart(devRedisAddr, embedded.StartRedisAt)
	if err != nil {
		return err
	}
	defer rs.Stop()
	if af.listen == admin.ListenDefault {
		if af.listen, err = devListen(af.listen); err != nil {
			return err
		}
	}

	pools, err := loadPools(*poolsFile)
	if err != nil {
		return err
	}
	// Mailbox tracing costs little here and makes `troupe trace` show
	// something; TROUPE_JOB_TRACE=off turns it off.
	node, err := troupe.NewNode(troupe.Config{NodeID: "dev-node", NATSURL: ns.URL(), RedisURL: rs.URL(),
		Pools: pools, Policy: safety.AllowAll{}, Logger: log,
		Tuning: troupe.Tuning{JobTrace: os.Getenv("TROUPE_JOB_TRACE") == ""}, OTLPEndpoint: *otlp})
	if err != nil {
		return err
	}
	if err := node.Start(ctx); err != nil {
		return err
	}
	defer node.Stop(context.Background())
	apiURL := ""
	if stopAdmin, err := af.start(node, log); err != nil {
		// The demo does not need the dashboard (the port may be taken).
		fmt.Printf("dashboard not started: %v\n", err)
	} else {
		defer stopAdmin()
		if af.listen != "" {
			apiURL = "http://" + af.listen
		}
	}

	nc, err := nats.Connect(ns.URL(), nats.Name("troupe-dev"))
	if err != nil {
		return err
	}
	defer nc.Close()
	subj := inspect.Of(node).Subjects()
	// Two workers that take direct dispatch and dedupe (so lost dispatches
	// are repeated to them) and one stock CAP worker that only listens on
	// its pool subject.
	for i, direct := range []bool{true, true, false} {
		w, err := worker.Start(nc, worker.Config{ID: worker.Name("default", i+1), Pool: "default",
			Topics: []string{"job.echo", "job.sleep"}, Direct: direct, SubjectPrefix: subj.Prefix(),
			Handler: demoHandler, Progress: true, Dedupe: direct})
		if err != nil {
			return err
		}
		defer w.Stop()
	}
	fmt.Printf("nats  %s%s\nredis %s%s\n", ns.URL(), devTaken(devNATSAddr, ns.Addr()), rs.URL(), devTaken(devRedisAddr, rs.Addr()))
	if apiURL != "" {
		fmt.Printf("api   %s  (dashboard %s/ui, metrics %s/metrics)%s\n", apiURL, apiURL, apiURL,
			devTaken(admin.ListenDefault, af.listen))
	}
	fmt.Printf("node  %s  workers default-w1, default-w2 (direct), default-w3 (pool subject)\n", node.ID())
	if ex := devExports(ns.URL(), rs.URL(), apiURL); ex != "" {
		// Printed before the demo, so a script can take it from the first lines.
		fmt.Printf("\nA standard port is taken; for the other commands to reach this node:\n%s\n", ex)
	}
	fmt.Println()
	waitWorkers(ctx, node, 3)

	ids := make([]string, 0, *jobs)
	for i := 0; i < *jobs; i++ {
		topic := "job.echo"
		if i%2 == 1 {
			topic = "job.sleep"
		}
		id := fmt.Sprintf("demo-%d-%s", i+1, newID("")[:6])
		ids = append(ids, id)
		// Each demo job has an input, shown by `troupe job <id>` and the
		// dashboard (the echo workers' result points back at it).
		ptr, err := inspect.Of(node).JobData().PutInput(ctx, id, fmt.Appendf(nil, `{"demo": %d, "topic": %q}`, i+1, topic))
		if err != nil {
			return err
		}
		req := &capv1.JobRequest{JobId: id, Topic: topic, ContextPtr: ptr, TenantId: "demo"}
		data, err := bus.EncodeRequest(id, "troupe-dev", req)
		if err != nil {
			return err
		}
		if err := nc.Publish(subj.Submit, data); err != nil {
			return err
		}
	}
	ok := 0
	for _, id := range ids {
		rec, err := waitTerminal(ctx, inspect.Of(node).Store(), id, 30*time.Second)
		if err != nil {
			return err
		}
		printJob(os.Stdout, rec)
		fmt.Println()
		if rec.State == jobstate.StateSucceeded {
			ok++
		}
	}
	fmt.Printf("%d of %d demo jobs SUCCEEDED\n", ok, len(ids))
	if ok != len(ids) {
		return fmt.Errorf("%d demo jobs did not succeed", len(ids)-ok)
	}
	if *exit {
		return nil
	}
	fmt.Printf("\nThe node keeps running. %sPress Ctrl-C to stop.\n", devTryHint(ns.URL(), rs.URL(), apiURL))
	<-ctx.Done()
	return nil
}

// Where `troupe dev` starts its servers when the ports are free: where
// every other command looks by default.
var (
	devNATSAddr  = hostPort(connect.NATSURLDefault)
	devRedisAddr = hostPort(connect.RedisURLDefault)
)

func hostPort(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		panic(err)
	}
	return u.Host
}

// devListen returns std (host:port) when its port is free to listen on,
// and otherwise the same host with a free port.
func devListen(std string) (string, error) {
	host, p, err := net.SplitHostPort(std)
	if err != nil {
		return "", err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", err
	}
	got, err := embedded.Port(host, port)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(got)), nil
}

// devStart starts an embedded server on std when its port is free and on
// another port otherwise (also when the port was taken between the check
// and the start).
func devStart[S any](std string, start func(addr string) (S, error)) (S, error) {
	addr, err := devListen(std)
	if err != nil {
		var zero S
		return zero, err
	}
	s, err := start(addr)
	if err != nil && addr == std {
		host, _, _ := net.SplitHostPort(std)
		s, err = start(net.JoinHostPort(host, "0"))
	}
	return s, err
}

// devTaken notes a server that could not have its standard address.
func devTaken(std, addr string) string {
	if addr == std {
		return ""
	}
	return fmt.Sprintf("  (%s is taken)", std)
}

// devExports is the line that points every other command at this dev
// node when one of its servers could not have its standard address: the
// commands read TROUPE_API_URL (operator commands), TROUPE_NATS_URL and
// TROUPE_REDIS_URL (node, worker, submit --bus). "" when all are standard.
// apiURL "" is no API.
func devExports(natsURL, redisURL, apiURL string) string {
	var vars []string
	if natsURL != connect.NATSURLDefault {
		vars = append(vars, "TROUPE_NATS_URL="+natsURL)
	}
	if redisURL != connect.RedisURLDefault {
		vars = append(vars, "TROUPE_REDIS_URL="+redisURL)
	}
	if apiURL != "" && apiURL != admin.URLDefault {
		vars = append(vars, "TROUPE_API_URL="+apiURL)
	}
	if len(vars) == 0 {
		return ""
	}
	return "export " + strings.Join(vars, " ")
}

// devTryHint is what `troupe dev` suggests trying against itself: the
// export line when a standard port was taken, then commands with no
// address flags. apiURL "" is no API, and then nothing to suggest but a
// worker.
func devTryHint(natsURL, redisURL, apiURL string) string {
	var b strings.Builder
	b.WriteString("Try, in another shell:\n")
	if ex := devExports(natsURL, redisURL, apiURL); ex != "" {
		fmt.Fprintf(&b, "  %s\n", ex)
	}
	if apiURL == "" {
		b.WriteString("  go run ./cmd/troupe worker --pool default --handler sleep\n")
		return b.String()
	}
	for _, c := range []string{"submit --topic job.echo --wait", "job list", "job <job_id>", "workers", "trace <job_id>", "dlq"} {
		fmt.Fprintf(&b, "  go run ./cmd/troupe %s\n", c)
	}
	return b.String()
}

// demoHandler is the dev workers': job.sleep sleeps, anything else
// echoes, and a job's env may make it fail (worker.Demo: demo.fail=1,
// demo.fatal=1, demo.sleep=2s).
func demoHandler(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
	if req.Topic == "job.sleep" {
		return worker.Demo(worker.Sleep(50*time.Millisecond))(ctx, req)
	}
	return worker.Demo(worker.Echo)(ctx, req)
}

func waitWorkers(ctx context.Context, node *troupe.Node, n int) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if ws, err := inspect.Of(node).Workers(); err == nil && len(ws) >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitTerminal polls a job until it is terminal or timeout passes.
func waitTerminal(ctx context.Context, st *store.Store, id string, timeout time.Duration) (*store.JobRecord, error) {
	deadline := time.Now().Add(timeout)
	for {
		rec, err := st.GetJob(ctx, id)
		if err == nil && rec.State.Terminal() {
			return rec, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return nil, fmt.Errorf("job %s: %w", id, err)
			}
			return rec, fmt.Errorf("job %s still %s after %s", id, rec.State, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
