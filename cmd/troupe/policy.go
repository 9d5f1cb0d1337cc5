package main

import (
	"flag"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/internal/policyx"
	"github.com/troupe-run/troupe/safety"
)

// policyFlags are the input-policy flags of `troupe node` and `troupe dev`.
type policyFlags struct {
	file     string
	addr     string
	failMode string
	approve  listFlag
	deny     listFlag
	output   string
	// TLS to the kernel (flags win over SAFETY_KERNEL_TLS_* in the env).
	tlsCA, tlsCert, tlsKey string
	tlsRequired, insecure  bool
}

func (p *policyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.file, "policy", envOr("TROUPE_POLICY_FILE", ""),
		"safety policy YAML for the built-in engine (reloaded on change)")
	fs.StringVar(&p.addr, "safety-addr", os.Getenv(policyx.EnvKernelAddr),
		"an external SafetyKernel (host:port); TLS from SAFETY_KERNEL_TLS_CA / _TLS_REQUIRED / _INSECURE")
	fs.StringVar(&p.failMode, "policy-fail-mode", "",
		"closed (default: jobs wait while the kernel is unavailable) or open (they proceed, counted); TROUPE_POLICY_CHECK_FAIL_MODE wins")
	fs.Var(&p.approve, "approve-topic", "without --policy: topic pattern whose jobs need a human approval (repeatable)")
	fs.Var(&p.deny, "deny-topic", "without --policy: topic pattern whose jobs are denied (repeatable)")
	fs.StringVar(&p.tlsCA, "safety-tls-ca", "", "PEM CA bundle that verifies the kernel (implies TLS)")
	fs.BoolVar(&p.tlsRequired, "safety-tls-required", false, "require TLS to the kernel (system roots without --safety-tls-ca)")
	fs.BoolVar(&p.insecure, "safety-insecure", false, "allow plaintext to a non-loopback kernel")
	fs.StringVar(&p.tlsCert, "safety-tls-cert", "", "client certificate for a kernel that requires one (mutual TLS)")
	fs.StringVar(&p.tlsKey, "safety-tls-key", "", "the client certificate's key")
	fs.StringVar(&p.output, "output-policy", "",
		"output policy YAML (scanners, rules, limits); also OUTPUT_POLICY_ENABLED / _FILE / _ADDR")
}

// buildOutput returns the output checker the flags and environment
// describe, or nil when results are not checked.
func (p *policyFlags) buildOutput() (safety.OutputChecker, error) {
	cfg, err := policyx.OutputConfigFromEnv()
	if err != nil {
		return nil, err
	}
	if p.output != "" {
		cfg.File = p.output
	}
	return policyx.NewOutputChecker(cfg)
}

// build returns the input policy the flags describe, and how to close it:
// an external kernel, else the built-in engine over --policy, else simple
// topic rules (allow-all when none are given).
func (p *policyFlags) build(conn connect.Settings, keyPrefix string, reg prometheus.Registerer, log *slog.Logger) (safety.InputPolicy, func(), error) {
	switch {
	case p.addr != "":
		cfg, err := policyx.KernelClientConfigFromEnv()
		if err != nil {
			return nil, nil, err
		}
		cfg.Addr = p.addr
		if p.tlsCA != "" {
			cfg.TLS.CAFile = p.tlsCA
		}
		if p.tlsCert != "" || p.tlsKey != "" {
			cfg.TLS.CertFile, cfg.TLS.KeyFile = p.tlsCert, p.tlsKey
		}
		cfg.TLS.Required = cfg.TLS.Required || p.tlsRequired
		cfg.TLS.Insecure = cfg.TLS.Insecure || p.insecure
		if p.failMode != "" {
			cfg.FailMode = policyx.FailMode(p.failMode)
		}
		rdb, err := connect.NewRedis(conn.RedisURL, conn.Redis)
		if err != nil {
			return nil, nil, err
		}
		cfg.Redis, cfg.KeyPrefix, cfg.Metrics, cfg.Log = rdb, keyPrefix, reg, log
		kc, err := policyx.NewKernelClient(cfg)
		if err != nil {
			_ = rdb.Close()
			return nil, nil, err
		}
		log.Info("input policy: external safety kernel", "addr", p.addr, "fail_mode", cfg.FailMode)
		return kc, func() { _ = kc.Close(); _ = rdb.Close() }, nil
	case p.file != "":
		e, err := safety.StartEngine(safety.EngineConfig{Path: p.file, Log: log})
		if err != nil {
			return nil, nil, err
		}
		log.Info("input policy: built-in engine", "file", p.file)
		return e, func() { _ = e.Close() }, nil
	}
	return safety.TopicRules{Approve: p.approve, Deny: p.deny}, func() {}, nil
}
