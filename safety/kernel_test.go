package safety_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/troupe-run/troupe/internal/policyx"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// A stock generated client (what an existing CAP scheduler uses) calls
// every RPC of the kernel Troupe serves.
func TestKernelServerAnswersAStockClient(t *testing.T) {
	t.Parallel()
	e, _ := loadTestPolicy(t)
	addr := serve(t, nil, func(s *grpc.Server) { capv1.RegisterSafetyKernelServer(s, policyx.NewKernelServer(e)) })
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	k := capv1.NewSafetyKernelClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := req("job.db.drop", "acme")
	for name, call := range map[string]func(context.Context, *capv1.PolicyCheckRequest, ...grpc.CallOption) (*capv1.PolicyCheckResponse, error){
		"Check": k.Check, "Evaluate": k.Evaluate, "Simulate": k.Simulate, "Explain": k.Explain,
	} {
		resp, err := call(ctx, r)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if resp.Decision != deny || resp.RuleId != "block-prod-delete" || len(resp.Remediations) != 1 ||
			!strings.HasPrefix(resp.PolicySnapshot, "v7:") {
			t.Fatalf("%s: %v", name, resp)
		}
		if name == "Explain" && !strings.HasPrefix(resp.Reason, "rule block-prod-delete matched: tenant acme, topic job.db.drop ~ job.db.drop") {
			t.Fatalf("Explain reason %q", resp.Reason)
		}
	}
	resp, err := k.Check(ctx, req("job.run", "beta", meta(func(m *capv1.JobMetadata) {
		m.Capability, m.ActorType = "code.exec", capv1.ActorType_ACTOR_TYPE_SERVICE
	})))
	if err != nil || resp.Decision != allowWith || resp.Constraints.GetBudgets().GetMaxRuntimeMs() != 60000 {
		t.Fatalf("constraints over the wire: %v %v", resp, err)
	}
	snaps, err := k.ListSnapshots(ctx, &capv1.ListSnapshotsRequest{})
	if err != nil || len(snaps.Snapshots) != 1 || snaps.Snapshots[0] != e.Policy().Snapshot {
		t.Fatalf("ListSnapshots: %v %v", snaps, err)
	}
}

// The kernel client reaches a TLS kernel with a CA file, and a mutual-TLS
// kernel only with a client certificate.
func TestKernelClientTLS(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	e, _ := loadTestPolicy(t)
	register := func(s *grpc.Server) { capv1.RegisterSafetyKernelServer(s, policyx.NewKernelServer(e)) }
	serverTLS, err := policyx.ServerTLS(p.serverCert, p.serverKey, "")
	if err != nil {
		t.Fatal(err)
	}
	mutualTLS, err := policyx.ServerTLS(p.serverCert, p.serverKey, p.caFile)
	if err != nil {
		t.Fatal(err)
	}
	tlsAddr := serve(t, tlsCreds(serverTLS), register)
	mtlsAddr := serve(t, tlsCreds(mutualTLS), register)
	ctx := context.Background()
	check := func(addr string, cfg policyx.ClientTLS) error {
		c, err := policyx.NewKernelClient(policyx.KernelClientConfig{Addr: addr, TLS: cfg, Log: quietLog, Timeout: 5 * time.Second})
		if err != nil {
			return err
		}
		defer c.Close()
		resp, err := c.Check(ctx, req("job.echo", ""))
		if err == nil && resp.RuleId != "echo" {
			t.Fatalf("resp %v", resp)
		}
		return err
	}
	if err := check(tlsAddr, policyx.ClientTLS{CAFile: p.caFile}); err != nil {
		t.Fatalf("TLS with CA: %v", err)
	}
	if err := check(tlsAddr, policyx.ClientTLS{Required: true}); !errors.Is(err, safety.ErrUnavailable) {
		t.Fatalf("TLS against the system roots should fail to verify a private CA: %v", err)
	}
	if err := check(tlsAddr, policyx.ClientTLS{}); !errors.Is(err, safety.ErrUnavailable) {
		t.Fatalf("plaintext to a TLS kernel: %v", err)
	}
	if err := check(mtlsAddr, policyx.ClientTLS{CAFile: p.caFile}); !errors.Is(err, safety.ErrUnavailable) {
		t.Fatalf("mTLS without a client certificate: %v", err)
	}
	if err := check(mtlsAddr, policyx.ClientTLS{CAFile: p.caFile, CertFile: p.clientCert, KeyFile: p.clientKey}); err != nil {
		t.Fatalf("mTLS with a client certificate: %v", err)
	}
}

func TestKernelClientConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  policyx.KernelClientConfig
		want error
	}{
		{"no address", policyx.KernelClientConfig{}, nil},
		{"plaintext to a remote kernel needs insecure", policyx.KernelClientConfig{Addr: "10.1.2.3:50051"}, policyx.ErrInsecureNotAllowed},
		{"insecure contradicts a CA", policyx.KernelClientConfig{Addr: "10.1.2.3:50051", TLS: policyx.ClientTLS{Insecure: true, CAFile: "x"}}, nil},
		{"cert without key", policyx.KernelClientConfig{Addr: "127.0.0.1:1", TLS: policyx.ClientTLS{CertFile: "x"}}, nil},
		{"missing CA file", policyx.KernelClientConfig{Addr: "127.0.0.1:1", TLS: policyx.ClientTLS{CAFile: "/nonexistent/ca.pem"}}, nil},
		{"bad fail mode", policyx.KernelClientConfig{Addr: "127.0.0.1:1", FailMode: "sideways"}, nil},
	} {
		c, err := policyx.NewKernelClient(tc.cfg)
		if err == nil {
			c.Close()
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		if tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, addr := range []string{"127.0.0.1:50051", "localhost:50051", "[::1]:50051"} {
		c, err := policyx.NewKernelClient(policyx.KernelClientConfig{Addr: addr})
		if err != nil {
			t.Errorf("%s: loopback plaintext refused: %v", addr, err)
			continue
		}
		c.Close()
	}
	c, err := policyx.NewKernelClient(policyx.KernelClientConfig{Addr: "kernel.internal:50051", TLS: policyx.ClientTLS{Insecure: true}})
	if err != nil {
		t.Fatalf("explicit insecure refused: %v", err)
	}
	c.Close()
}

// Not parallel: it sets the environment.
func TestKernelClientConfigFromEnv(t *testing.T) {
	t.Setenv(policyx.EnvKernelAddr, "kernel:50051")
	t.Setenv(policyx.EnvKernelTLSCA, "/etc/ca.pem")
	t.Setenv(policyx.EnvKernelTLSReq, "true")
	t.Setenv(policyx.EnvKernelInsecure, "")
	t.Setenv(policyx.EnvFailMode, "OPEN")
	t.Setenv(policyx.EnvDecisionTTL, "30")
	cfg, err := policyx.KernelClientConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "kernel:50051" || cfg.TLS.CAFile != "/etc/ca.pem" || !cfg.TLS.Required || cfg.TLS.Insecure ||
		cfg.FailMode != policyx.FailOpen || cfg.CacheTTL != 30*time.Second {
		t.Fatalf("cfg %+v", cfg)
	}
	t.Setenv(policyx.EnvDecisionTTL, "1m30s")
	if cfg, _ = policyx.KernelClientConfigFromEnv(); cfg.CacheTTL != 90*time.Second {
		t.Fatalf("ttl %v", cfg.CacheTTL)
	}
	t.Setenv(policyx.EnvKernelInsecure, "maybe")
	if _, err := policyx.KernelClientConfigFromEnv(); err == nil {
		t.Fatal("bad bool accepted")
	}
	t.Setenv(policyx.EnvKernelInsecure, "")

	// The environment's fail mode overrides a config built elsewhere.
	c, err := policyx.NewKernelClient(policyx.KernelClientConfig{Addr: "127.0.0.1:1", FailMode: policyx.FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.FailMode() != policyx.FailOpen {
		t.Fatalf("fail mode %v, want the env's open", c.FailMode())
	}
}
