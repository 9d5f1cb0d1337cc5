// Package connect dials NATS and Redis with credentials and TLS: the one
// place every Troupe connection (the node, the worker, each CLI command)
// gets its authentication from.
//
// Settings come from flags, the environment and a YAML file (Flags), in
// that order of precedence. Secrets may be given in a file of their own
// (--nats-password-file, TROUPE_REDIS_PASSWORD_FILE, ...), so they need not
// be on a command line. Nothing here logs or returns a secret: every error
// names its server with the credentials redacted and has any configured
// secret scrubbed from its text.
package connect

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
)

// ErrConfig marks a connection setting that cannot work (two kinds of
// credentials at once, a certificate without its key, an unreadable file).
var ErrConfig = errors.New("bad connection settings")

// Redacted stands in for a secret in URLs and messages.
const Redacted = "xxxxx"

// TLS says how a client verifies its server and proves itself to it. Any
// field set turns TLS on.
type TLS struct {
	// CAFile is a PEM bundle that verifies the server (default: the system roots).
	CAFile string `yaml:"ca"`
	// CertFile and KeyFile, both or neither, are the client's certificate for
	// servers that require one (mutual TLS).
	CertFile string `yaml:"cert"`
	KeyFile  string `yaml:"key"`
	// ServerName is the name verified in the server's certificate (default:
	// the host dialed).
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any server certificate. For tests only: it
	// is logged as a warning.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// Enabled reports whether any TLS setting is given.
func (t TLS) Enabled() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerify
}

// Config builds the tls.Config; what names the server is for error text.
func (t TLS) Config(what string) (*tls.Config, error) {
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, fmt.Errorf("%w: %s TLS: a client certificate needs both the cert and the key file", ErrConfig, what)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %s TLS CA file: %w", ErrConfig, what, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: %s TLS CA file %s: no PEM certificate in it", ErrConfig, what, t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			// The key file's content is never part of this error (crypto/tls
			// reports the kind of failure, not the bytes).
			return nil, fmt.Errorf("%w: %s TLS client certificate %s: %w", ErrConfig, what, t.CertFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// readSecret reads a secret from a file, without its trailing line break.
func readSecret(what, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: %s file: %w", ErrConfig, what, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%w: %s file %s is empty", ErrConfig, what, path)
	}
	return s, nil
}

// RedactURLs returns a URL, or a comma-separated list of them, with every
// credential hidden: a password becomes "xxxxx" (the user name stays), and
// a user part without a password (a NATS token) is hidden whole. A part
// that does not parse keeps only what follows its last '@'.
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		parts[i] = redactURL(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || (u.User == nil && strings.Contains(s, "@")) {
		if i := strings.LastIndex(s, "@"); i >= 0 {
			return Redacted + s[i:]
		}
		return s
	}
	if u.User == nil {
		return s
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), Redacted)
	} else {
		u.User = url.User(Redacted)
	}
	return u.String()
}

// urlSecrets lists the credentials written into URLs (passwords, and user
// parts without a password, which NATS reads as tokens).
func urlSecrets(urls string) []string {
	var out []string
	for _, p := range strings.Split(urls, ",") {
		p = strings.TrimSpace(p)
		u, err := url.Parse(p)
		if err != nil {
			// The whole unparsable part may hold a secret: hide its user part.
			if i := strings.LastIndex(p, "@"); i >= 0 {
				userinfo := p[:i]
				if j := strings.Index(userinfo, "://"); j >= 0 {
					userinfo = userinfo[j+3:]
				}
				out = append(out, userinfo)
				if _, pw, ok := strings.Cut(userinfo, ":"); ok {
					out = append(out, pw)
				}
			}
			continue
		}
		if u.User == nil {
			continue
		}
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw, url.QueryEscape(pw), url.PathEscape(pw))
		} else {
			out = append(out, u.User.Username())
		}
	}
	return out
}

// scrubbedError carries an error whose text has every known secret
// replaced; errors.Is and errors.As still see the original.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// wrap names the server (redacted) and scrubs the secrets from err's text.
func wrap(kind, urls string, err error, secrets []string) error {
	if err == nil {
		return nil
	}
	return &scrubbedError{msg: scrub(fmt.Sprintf("connect: %s %s: %v", kind, RedactURLs(urls), err), secrets), err: err}
}

func scrub(s string, secrets []string) string {
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, Redacted)
		}
	}
	return s
}

// isLoopbackHost: the host names this machine, where plaintext crosses no
// network.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// hostsOf returns the hosts of a comma-separated URL list (entries without a
// scheme are host:port).
func hostsOf(urls string) []string {
	var out []string
	for _, p := range strings.Split(urls, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !strings.Contains(p, "://") {
			p = "x://" + p
		}
		if u, err := url.Parse(p); err == nil {
			out = append(out, u.Hostname())
		}
	}
	return out
}

// plaintextRemote reports a host in urls that is not loopback, when the
// connection would carry a secret without TLS.
func plaintextRemote(urls string) (string, bool) {
	for _, h := range hostsOf(urls) {
		if !isLoopbackHost(h) {
			return h, true
		}
	}
	return "", false
}
