package safety_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/troupe-run/troupe/proto/capv1"
)

var quietLog = slog.New(slog.DiscardHandler)

// serve registers services on a gRPC server listening on 127.0.0.1:0 and
// returns its address; the server stops at test end.
func serve(t testing.TB, creds credentials.TransportCredentials, register func(*grpc.Server)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(opts...)
	register(srv)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// Modes of the fake kernel.
const (
	kernelOK int32 = iota
	kernelFail
	kernelHang
)

// fakeKernel is a SafetyKernel whose behaviour a test switches: answer,
// fail (Unavailable), or hang until the caller's deadline.
type fakeKernel struct {
	capv1.UnimplementedSafetyKernelServer
	mode     atomic.Int32
	decision atomic.Int32
	calls    atomic.Int64
	// entered, if set, receives a token when a call starts hanging.
	entered chan struct{}
}

func newFakeKernel() *fakeKernel {
	k := &fakeKernel{}
	k.decision.Store(int32(capv1.DecisionType_DECISION_TYPE_ALLOW))
	return k
}

func (k *fakeKernel) Check(ctx context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	k.calls.Add(1)
	switch k.mode.Load() {
	case kernelFail:
		return nil, status.Error(codes.Unavailable, "kernel down")
	case kernelHang:
		if k.entered != nil {
			k.entered <- struct{}{}
		}
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	d := capv1.DecisionType(k.decision.Load())
	resp := &capv1.PolicyCheckResponse{Decision: d, Reason: "fake", RuleId: "fake", PolicySnapshot: "fake:1"}
	if d == capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN {
		resp.ApprovalRequired, resp.ApprovalRef = true, req.JobId
	}
	return resp, nil
}

// clock is a hand-moved time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Unix(1_800_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// pki is a throwaway CA with a server certificate for 127.0.0.1 and a
// client certificate, as PEM files in a temp dir.
type pki struct {
	caFile, serverCert, serverKey, clientCert, clientKey string
}

func newPKI(t testing.TB) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "troupe test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p := pki{caFile: filepath.Join(dir, "ca.pem")}
	writePEM(t, p.caFile, "CERTIFICATE", caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		cf, kf := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		writePEM(t, cf, "CERTIFICATE", der)
		writePEM(t, kf, "EC PRIVATE KEY", kder)
		return cf, kf
	}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// counterValue sums a counter's series having label=value (0 if none).
func counterValue(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

func tlsCreds(cfg *tls.Config) credentials.TransportCredentials { return credentials.NewTLS(cfg) }
