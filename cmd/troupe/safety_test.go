package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/troupe-run/troupe/internal/policyx"
	"github.com/troupe-run/troupe/proto/capv1"
)

const servePolicy = `version: cli
rules:
  - id: no-admin
    match: {topics: ["job.admin.*"]}
    decision: deny
    reason: admin jobs go through the console
`

// startServe runs `troupe safety serve` in process and returns its address
// and a stop function that waits for it to return.
func startServe(t *testing.T, o safetyServeOpts) (string, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	o.listen, o.log, o.ready = "127.0.0.1:0", slog.New(slog.DiscardHandler), func(a string) { ready <- a }
	done := make(chan error, 1)
	go func() { done <- serveSafety(ctx, o) }()
	select {
	case addr := <-ready:
		return addr, func() error {
			cancel()
			select {
			case err := <-done:
				return err
			case <-time.After(10 * time.Second):
				t.Fatal("serve did not stop")
				return nil
			}
		}
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("serve did not start")
	}
	return "", nil
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// `troupe safety serve` answers a stock CAP SafetyKernel client.
func TestSafetyServeAnswersAStockClient(t *testing.T) {
	t.Parallel()
	addr, stop := startServe(t, safetyServeOpts{policy: writeFile(t, "policy.yaml", servePolicy)})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	k := capv1.NewSafetyKernelClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := k.Check(ctx, &capv1.PolicyCheckRequest{JobId: "j", Topic: "job.admin.reset", Tenant: "default"})
	if err != nil || resp.Decision != capv1.DecisionType_DECISION_TYPE_DENY || resp.RuleId != "no-admin" ||
		!strings.HasPrefix(resp.PolicySnapshot, "cli:") {
		t.Fatalf("check: %v %v", resp, err)
	}
	resp, err = k.Explain(ctx, &capv1.PolicyCheckRequest{JobId: "j", Topic: "job.admin.reset"})
	if err != nil || !strings.HasPrefix(resp.Reason, "rule no-admin matched: topic job.admin.reset ~ job.admin.*") {
		t.Fatalf("explain: %v %v", resp, err)
	}
	snaps, err := k.ListSnapshots(ctx, &capv1.ListSnapshotsRequest{})
	if err != nil || len(snaps.Snapshots) != 1 {
		t.Fatalf("snapshots: %v %v", snaps, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("serve returned %v", err)
	}
}

// With --tls-cert/--tls-key the kernel serves TLS, and the KernelClient
// reaches it with the CA file.
func TestSafetyServeTLS(t *testing.T) {
	t.Parallel()
	caFile, certFile, keyFile := testCerts(t)
	addr, stop := startServe(t, safetyServeOpts{policy: writeFile(t, "policy.yaml", servePolicy), tlsCert: certFile, tlsKey: keyFile})
	defer stop()
	c, err := policyx.NewKernelClient(policyx.KernelClientConfig{Addr: addr, TLS: policyx.ClientTLS{CAFile: caFile},
		Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := c.Check(context.Background(), &capv1.PolicyCheckRequest{JobId: "j", Topic: "job.echo"})
	if err != nil || resp.Decision != capv1.DecisionType_DECISION_TYPE_ALLOW {
		t.Fatalf("check over TLS: %v %v", resp, err)
	}
}

func TestSafetyServeRefusesBadSettings(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	good := writeFile(t, "p.yaml", servePolicy)
	for name, o := range map[string]safetyServeOpts{
		"no policy":        {listen: "127.0.0.1:0", log: log},
		"invalid policy":   {policy: writeFile(t, "bad.yaml", "rules:\n  - id: a\n    decison: deny\n"), listen: "127.0.0.1:0", log: log},
		"cert without key": {policy: good, tlsCert: "c.pem", listen: "127.0.0.1:0", log: log},
		"client CA alone":  {policy: good, clientCA: "ca.pem", listen: "127.0.0.1:0", log: log},
	} {
		if err := serveSafety(ctx, o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestSafetyValidate(t *testing.T) {
	t.Parallel()
	if err := runSafetyValidate([]string{writeFile(t, "p.yaml", servePolicy)}); err != nil {
		t.Fatal(err)
	}
	err := runSafetyValidate([]string{writeFile(t, "bad.yaml", "version: x\nrulez: []\n")})
	if err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "rulez") {
		t.Fatalf("invalid policy: %v", err)
	}
}

// testCerts writes a throwaway CA and a server certificate for 127.0.0.1.
func testCerts(t *testing.T) (caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, IsCA: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kernel"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	caCert, _ := x509.ParseCertificate(caDER)
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	write := func(name, typ string, b []byte) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("kernel.pem", "CERTIFICATE", der), write("kernel-key.pem", "EC PRIVATE KEY", kder)
}
