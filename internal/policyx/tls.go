package policyx

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ErrInsecureNotAllowed: a kernel address off this machine was given with
// no TLS settings. Plaintext to a remote kernel must be asked for
// (ClientTLS.Insecure, SAFETY_KERNEL_INSECURE=true): a policy decision
// anyone on the path can forge is no policy.
var ErrInsecureNotAllowed = errors.New("policy: plaintext to a non-loopback kernel needs an explicit insecure setting")

// ClientTLS says how a client reaches a kernel (or output policy service).
type ClientTLS struct {
	// CAFile verifies the server against this PEM CA bundle (implies TLS).
	CAFile string
	// Required asks for TLS even without CAFile (the system roots verify).
	Required bool
	// Insecure asks for plaintext. It contradicts CAFile and Required. Not
	// needed for loopback addresses, which default to plaintext.
	Insecure bool
	// CertFile and KeyFile, both or neither, are the client's certificate
	// for servers that require one (mutual TLS; implies TLS).
	CertFile, KeyFile string
	// ServerName overrides the name verified in the server's certificate
	// (default: the host of the address).
	ServerName string
}

func (c ClientTLS) wantsTLS() bool {
	return c.CAFile != "" || c.Required || c.CertFile != "" || c.KeyFile != ""
}

// Credentials returns the gRPC transport credentials for addr.
func (c ClientTLS) Credentials(addr string) (credentials.TransportCredentials, error) {
	if c.Insecure && c.wantsTLS() {
		return nil, errors.New("safety: insecure contradicts the TLS settings (CA file, TLS required, client certificate)")
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New("safety: a client certificate needs both the cert and the key file")
	}
	if !c.wantsTLS() {
		if c.Insecure || isLoopback(addr) {
			return insecure.NewCredentials(), nil
		}
		return nil, fmt.Errorf("%w: %s (set a CA file, TLS required, or insecure)", ErrInsecureNotAllowed, addr)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pool, err := loadCertPool(c.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("safety: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg), nil
}

// ServerTLS builds a kernel's TLS config from its certificate and key;
// with clientCAFile, clients must present a certificate signed by it.
func ServerTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("safety: server certificate: %w", err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if clientCAFile != "" {
		pool, err := loadCertPool(clientCAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

func loadCertPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("safety: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("safety: CA file %s: no PEM certificate in it", file)
	}
	return pool, nil
}

// isLoopback: the address names this machine (or a unix socket), where
// plaintext crosses no network.
func isLoopback(addr string) bool {
	if strings.HasPrefix(addr, "unix:") {
		return true
	}
	addr = strings.TrimPrefix(addr, "dns:///")
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
