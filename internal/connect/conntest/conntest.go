// Package conntest gives tests servers that demand credentials and TLS: a
// certificate authority made on the spot, an in-process NATS server with
// auth and (mutual) TLS, and a redis-server child process with ACL users and
// TLS. Everything is on loopback and is removed in t.Cleanup.
package conntest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// PKI is a CA with one server certificate (127.0.0.1, localhost) and one
// client certificate, as PEM files in a test's temporary directory.
type PKI struct {
	Dir                   string
	CAFile                string
	ServerCert, ServerKey string
	ClientCert, ClientKey string

	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPool *x509.CertPool
}

// NewPKI makes a fresh CA and its two certificates (ECDSA P-256, valid one hour).
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	p := &PKI{Dir: t.TempDir()}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: "troupe test CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	p.caKey = key
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(p.ca)
	p.CAFile = p.write(t, "ca.pem", "CERTIFICATE", der)
	p.ServerCert, p.ServerKey = p.issue(t, "server", x509.ExtKeyUsageServerAuth)
	p.ClientCert, p.ClientKey = p.issue(t, "client", x509.ExtKeyUsageClientAuth)
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (p *PKI) issue(t testing.TB, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: "troupe test " + name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+"-key.pem", "PRIVATE KEY", kder)
}

func (p *PKI) write(t testing.TB, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.Dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// WriteFile writes content to a fresh file only the owner can read (a
// secret, a config) and returns its path.
func WriteFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// ServerTLS is the server side: its certificate, and with requireClient,
// client certificates signed by the CA are required.
func (p *PKI) ServerTLS(t testing.TB, requireClient bool) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(p.ServerCert, p.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if requireClient {
		cfg.ClientCAs, cfg.ClientAuth = p.caPool, tls.RequireAndVerifyClientCert
	}
	return cfg
}

// StartNATS runs an in-process NATS server with JetStream on a free loopback
// port; configure sets its auth and TLS. It returns the client URL.
func StartNATS(t testing.TB, configure func(*server.Options)) string {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	if configure != nil {
		configure(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("conntest: nats: %v", err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("conntest: nats not ready after 10s")
	}
	addr := srv.Addr().(*net.TCPAddr)
	scheme := "nats"
	if opts.TLSConfig != nil {
		scheme = "tls"
	}
	return scheme + "://127.0.0.1:" + strconv.Itoa(addr.Port)
}

// Redis is a redis-server child process.
type Redis struct {
	// Addr is the plaintext port, TLSAddr the TLS port (host:port).
	Addr, TLSAddr string
}

// RedisUser is an ACL user with every permission.
type RedisUser struct{ Name, Password string }

// StartRedis runs /usr/bin/redis-server (or the one on PATH) with the
// default user off, the given ACL users, a plaintext port and a TLS port
// that requires client certificates signed by pki's CA. The test is skipped
// when no redis-server is installed.
func StartRedis(t testing.TB, pki *PKI, users ...RedisUser) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("conntest: no redis-server on PATH")
	}
	port, tlsPort := freePort(t), freePort(t)
	dir := t.TempDir()
	args := []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", pki.ServerCert, "--tls-key-file", pki.ServerKey, "--tls-ca-cert-file", pki.CAFile,
		"--tls-auth-clients", "yes", "--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning",
		"--user", "default", "off"}
	for _, u := range users {
		args = append(args, "--user", u.Name, "on", ">"+u.Password, "~*", "&*", "+@all")
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("conntest: redis-server: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		_ = out.Close()
	})
	r := &Redis{Addr: "127.0.0.1:" + strconv.Itoa(port), TLSAddr: "127.0.0.1:" + strconv.Itoa(tlsPort)}
	// Ready when both ports accept: at most 10 s in 20 ms steps.
	for i := 0; i < 500; i++ {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("conntest: redis-server exited: %s", log)
		default:
		}
		if accepts(r.Addr) && accepts(r.TLSAddr) {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("conntest: redis-server not listening after 10s")
	return nil
}

func accepts(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before the server binds; the server then fails to start and the
// test says so.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
