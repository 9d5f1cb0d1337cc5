package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/internal/policyx"
	"github.com/troupe-run/troupe/internal/ratelimit"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// runSafety runs the built-in policy engine as a CAP SafetyKernel, or asks
// one a question.
//
//	troupe safety serve    --policy FILE [--listen ADDR] [--tls-cert F --tls-key F [--client-ca F]] [--output-policy FILE [--redis URL]]
//	troupe safety check    [--addr ADDR] --topic T [--tenant T] [--label k=v ...] [--rpc check|explain|simulate|evaluate|snapshots]
//	troupe safety validate FILE
func runSafety(ctx context.Context, args []string) error {
	const usage = "usage: troupe safety serve|check|validate [flags] (troupe safety <sub> -h for flags)"
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(os.Stderr, usage)
		return flag.ErrHelp
	case "serve":
		return runSafetyServe(ctx, args[1:])
	case "check":
		return runSafetyCheck(ctx, args[1:])
	case "validate":
		return runSafetyValidate(args[1:])
	}
	return fmt.Errorf("unknown subcommand %q (want serve, check or validate)", args[0])
}

// safetyServeOpts are `troupe safety serve`'s settings.
type safetyServeOpts struct {
	policy, listen            string
	reload                    time.Duration // policy poll; 0: the engine's default
	tlsCert, tlsKey, clientCA string
	outputPolicy, outputRedis string
	outputRedisAuth           connect.Redis
	log                       *slog.Logger
	// ready, if set, is called with the bound address once serving (tests).
	ready func(addr string)
}

func runSafetyServe(ctx context.Context, args []string) error {
	fs := newFlags("safety serve")
	var c common
	c.register(fs, false, false)
	var o safetyServeOpts
	fs.StringVar(&o.policy, "policy", os.Getenv("SAFETY_POLICY_FILE"), "safety policy YAML (env SAFETY_POLICY_FILE); re-read within a second of a change")
	reload, err := reloadInterval()
	if err != nil {
		return err
	}
	fs.DurationVar(&o.reload, "reload-interval", reload, "how often the policy file is checked for changes (env SAFETY_POLICY_RELOAD_INTERVAL)")
	fs.StringVar(&o.listen, "listen", envOr("SAFETY_KERNEL_LISTEN", "127.0.0.1:50051"), "gRPC listen address (env SAFETY_KERNEL_LISTEN)")
	fs.StringVar(&o.tlsCert, "tls-cert", os.Getenv("SAFETY_KERNEL_TLS_CERT"), "server certificate (PEM); with --tls-key, serve TLS")
	fs.StringVar(&o.tlsKey, "tls-key", os.Getenv("SAFETY_KERNEL_TLS_KEY"), "server key (PEM)")
	fs.StringVar(&o.clientCA, "client-ca", os.Getenv("SAFETY_KERNEL_CLIENT_CA"), "require client certificates signed by this CA (mutual TLS)")
	fs.StringVar(&o.outputPolicy, "output-policy", os.Getenv(policyx.EnvOutputFile), "also serve the OutputPolicy service with this output policy file")
	// --redis: where the OutputPolicy service reads result content from
	// (phase 2) and stores redacted copies; none without the flag.
	c.conn.Register(fs, connect.Want{OptionalRedis: true})
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	o.log = c.logger()
	conn, err := c.conns()
	if err != nil {
		return err
	}
	o.outputRedis, o.outputRedisAuth = conn.RedisURL, conn.Redis
	return serveSafety(ctx, o)
}

func serveSafety(ctx context.Context, o safetyServeOpts) error {
	if o.policy == "" {
		return errors.New("--policy is required")
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if o.clientCA != "" && o.tlsCert == "" {
		return errors.New("--client-ca needs --tls-cert and --tls-key")
	}
	engine, err := safety.StartEngine(safety.EngineConfig{Path: o.policy, Poll: o.reload, Log: o.log})
	if err != nil {
		return err
	}
	defer engine.Close()
	var opts []grpc.ServerOption
	if o.tlsCert != "" {
		tcfg, err := policyx.ServerTLS(o.tlsCert, o.tlsKey, o.clientCA)
		if err != nil {
			return err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tcfg)))
	} else if !isLoopbackListen(o.listen) {
		o.log.Warn("serving plaintext on a non-loopback address: decisions can be read and forged on the path; use --tls-cert/--tls-key",
			"listen", o.listen)
	}
	srv := grpc.NewServer(opts...)
	capv1.RegisterSafetyKernelServer(srv, policyx.NewKernelServer(engine))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	if o.outputPolicy != "" {
		op, err := safety.LoadOutputPolicy(o.outputPolicy)
		if err != nil {
			return err
		}
		var results safety.ResultStore
		if o.outputRedis != "" {
			rdb, err := connect.NewRedis(o.outputRedis, o.outputRedisAuth)
			if err != nil {
				return err
			}
			defer rdb.Close()
			results = &safety.RedisResultStore{Client: rdb}
		}
		capv1.RegisterOutputPolicyServer(srv, policyx.NewOutputServer(op, results))
		o.log.Info("serving the output policy", "snapshot", op.Snapshot, "content_access", results != nil)
	}
	lis, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	o.log.Info("safety kernel serving", "addr", lis.Addr().String(), "tls", o.tlsCert != "", "mtls", o.clientCA != "",
		"snapshot", engine.Policy().Snapshot)
	if o.ready != nil {
		o.ready(lis.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	hs.Shutdown()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		srv.Stop() // in-flight checks take milliseconds; something is stuck
	}
	return nil
}

// reloadInterval reads SAFETY_POLICY_RELOAD_INTERVAL, the variable CAP
// kernels use (a duration, or seconds); Troupe's default is a second, not
// CAP's 30 s, because a reload costs one small file read.
func reloadInterval() (time.Duration, error) {
	v := strings.TrimSpace(os.Getenv("SAFETY_POLICY_RELOAD_INTERVAL"))
	if v == "" {
		return safety.EnginePollDefault, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return d, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("SAFETY_POLICY_RELOAD_INTERVAL=%q: want a duration or seconds", v)
	}
	return time.Duration(n) * time.Second, nil
}

func isLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func runSafetyCheck(ctx context.Context, args []string) error {
	fs := newFlags("safety check")
	addr := fs.String("addr", envOr(policyx.EnvKernelAddr, "127.0.0.1:50051"), "kernel address (env SAFETY_KERNEL_ADDR)")
	ca := fs.String("tls-ca", os.Getenv(policyx.EnvKernelTLSCA), "verify the kernel with this CA (env SAFETY_KERNEL_TLS_CA)")
	tlsReq := fs.Bool("tls-required", false, "use TLS with the system roots")
	insecure := fs.Bool("insecure", false, "plaintext to a non-loopback kernel")
	cert := fs.String("tls-cert", "", "client certificate (mutual TLS)")
	key := fs.String("tls-key", "", "client key (mutual TLS)")
	rpc := fs.String("rpc", "explain", "check, evaluate, explain, simulate or snapshots")
	timeout := fs.Duration("timeout", policyx.KernelTimeoutDefault, "call timeout")
	req := &capv1.PolicyCheckRequest{Labels: map[string]string{}, Meta: &capv1.JobMetadata{}}
	fs.StringVar(&req.Topic, "topic", "", "job topic")
	fs.StringVar(&req.Tenant, "tenant", "default", "tenant")
	fs.StringVar(&req.JobId, "job-id", "cli-check", "job id")
	fs.StringVar(&req.PrincipalId, "principal", "", "principal id")
	fs.StringVar(&req.Meta.Capability, "capability", "", "meta.capability")
	fs.StringVar(&req.Meta.PackId, "pack", "", "meta.pack_id")
	fs.StringVar(&req.Meta.ActorId, "actor", "", "meta.actor_id")
	actorType := fs.String("actor-type", "", "meta.actor_type: human or service")
	var riskTags, requires listFlag
	fs.Var(&riskTags, "risk-tag", "meta.risk_tags entry (repeatable)")
	fs.Var(&requires, "requires", "meta.requires entry (repeatable)")
	fs.Var(labelsFlag(req.Labels), "label", "label k=v (repeatable; mcp.server=..., secrets_present=true)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	req.Meta.RiskTags, req.Meta.Requires = riskTags, requires
	switch strings.ToLower(*actorType) {
	case "":
	case "human":
		req.Meta.ActorType = capv1.ActorType_ACTOR_TYPE_HUMAN
	case "service":
		req.Meta.ActorType = capv1.ActorType_ACTOR_TYPE_SERVICE
	default:
		return fmt.Errorf("--actor-type %q: want human or service", *actorType)
	}
	creds, err := policyx.ClientTLS{CAFile: *ca, Required: *tlsReq, Insecure: *insecure, CertFile: *cert, KeyFile: *key}.
		Credentials(*addr)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	k := capv1.NewSafetyKernelClient(conn)
	cctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var out proto.Message
	switch *rpc {
	case "snapshots":
		out, err = k.ListSnapshots(cctx, &capv1.ListSnapshotsRequest{})
	case "check", "evaluate", "explain", "simulate":
		if req.Topic == "" {
			return errors.New("--topic is required")
		}
		call := map[string]func(context.Context, *capv1.PolicyCheckRequest, ...grpc.CallOption) (*capv1.PolicyCheckResponse, error){
			"check": k.Check, "evaluate": k.Evaluate, "explain": k.Explain, "simulate": k.Simulate}[*rpc]
		out, err = call(cctx, req)
	default:
		return fmt.Errorf("--rpc %q: want check, evaluate, explain, simulate or snapshots", *rpc)
	}
	if err != nil {
		return err
	}
	fmt.Println(protojson.MarshalOptions{Multiline: true}.Format(out))
	return nil
}

func runSafetyValidate(args []string) error {
	const usage = "usage: troupe safety validate FILE"
	if len(args) == 1 && isHelp(args[0]) {
		fmt.Fprintln(os.Stderr, usage)
		return flag.ErrHelp
	}
	if len(args) != 1 {
		return errors.New(usage)
	}
	data, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	p, err := safety.ParsePolicy(data)
	if err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	kind := "rules"
	if p.Legacy {
		kind = "legacy tenant rules"
	}
	limits := ""
	if p.Limits() != nil { // Troupe's rate_limits and concurrency_keys, as a node reads them
		rates, err := ratelimit.Parse(p.Limits())
		if err != nil {
			return fmt.Errorf("%s: %w", args[0], err)
		}
		keys, err := router.ParseKeys(p.Limits())
		if err != nil {
			return fmt.Errorf("%s: %w", args[0], err)
		}
		n := 0
		if rates != nil {
			n = len(rates.Buckets) + len(rates.Templates)
		}
		limits = fmt.Sprintf("; %d rate limit buckets, %d concurrency keys", n, len(keys))
	}
	fmt.Printf("%s: valid; snapshot %s; %d %s%s\n", args[0], p.Snapshot, p.Rules(), kind, limits)
	return nil
}
