package connect

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// NATS holds the credentials and TLS settings for a NATS connection. At most
// one kind of credential may be set: user and password, a token, an NKey
// seed file, or a credentials (.creds) file — or credentials in the URL
// (nats://user:pass@host, nats://token@host), which then must be the only
// ones. The zero value connects with what the URL carries.
type NATS struct {
	User string `yaml:"user"`
	// Password, or PasswordFile holding it (one of the two).
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
	// Token, or TokenFile holding it (one of the two).
	Token     string `yaml:"token"`
	TokenFile string `yaml:"token_file"`
	// NKeyFile is a user NKey seed file (the seed never leaves this process:
	// the server's nonce is signed with it).
	NKeyFile string `yaml:"nkey"`
	// CredsFile is a .creds file (user JWT and NKey seed), for servers in
	// operator (decentralised JWT) mode.
	CredsFile string `yaml:"creds"`
	TLS       TLS    `yaml:"tls"`
}

// methods lists the kinds of credential set, for the one-kind rule.
func (o NATS) methods() []string {
	var m []string
	if o.User != "" || o.Password != "" || o.PasswordFile != "" {
		m = append(m, "user/password")
	}
	if o.Token != "" || o.TokenFile != "" {
		m = append(m, "token")
	}
	if o.NKeyFile != "" {
		m = append(m, "nkey")
	}
	if o.CredsFile != "" {
		m = append(m, "creds")
	}
	return m
}

// secrets lists every secret o and the URL carry, for scrubbing messages.
func (o NATS) secrets(urls string) []string {
	return append(urlSecrets(urls), o.Password, o.Token)
}

// Options returns the nats.Options that authenticate and secure a
// connection to urls (one URL or a comma-separated list). The caller adds
// its own (name, reconnect policy, handlers).
func (o NATS) Options(urls string) ([]nats.Option, error) {
	m := o.methods()
	if len(m) > 1 {
		return nil, fmt.Errorf("%w: give one kind of credential, not %s", ErrConfig, strings.Join(m, " and "))
	}
	if len(m) == 1 && urlHasUser(urls) {
		return nil, fmt.Errorf("%w: credentials both in the URL and as %s settings; give them once", ErrConfig, m[0])
	}
	if o.Password != "" && o.PasswordFile != "" {
		return nil, fmt.Errorf("%w: password and password file both set", ErrConfig)
	}
	if o.Token != "" && o.TokenFile != "" {
		return nil, fmt.Errorf("%w: token and token file both set", ErrConfig)
	}
	var opts []nats.Option
	switch {
	case o.User != "" || o.Password != "" || o.PasswordFile != "":
		pw := o.Password
		if o.PasswordFile != "" {
			var err error
			if pw, err = readSecret("nats password", o.PasswordFile); err != nil {
				return nil, err
			}
		}
		if o.User == "" {
			return nil, fmt.Errorf("%w: a password needs a user", ErrConfig)
		}
		opts = append(opts, nats.UserInfo(o.User, pw))
	case o.Token != "" || o.TokenFile != "":
		tok := o.Token
		if o.TokenFile != "" {
			var err error
			if tok, err = readSecret("nats token", o.TokenFile); err != nil {
				return nil, err
			}
		}
		opts = append(opts, nats.Token(tok))
	case o.NKeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(o.NKeyFile)
		if err != nil {
			// nats.go names the file and the problem, never the seed.
			return nil, fmt.Errorf("%w: nats nkey seed file %s: %w", ErrConfig, o.NKeyFile, err)
		}
		opts = append(opts, opt)
	case o.CredsFile != "":
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.TLS.Enabled() {
		cfg, err := o.TLS.Config("nats")
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(cfg))
	}
	return opts, nil
}

// Warnings lists what an operator should know about these settings: a
// secret sent in plaintext off this machine, certificate checks turned off.
func (o NATS) Warnings(urls string) []string {
	var w []string
	if o.TLS.InsecureSkipVerify {
		w = append(w, "nats: TLS certificate verification is off (insecure skip verify)")
	}
	sendsSecret := o.User != "" || o.Token != "" || o.TokenFile != "" || o.PasswordFile != "" || urlHasUser(urls)
	if sendsSecret && !o.TLS.Enabled() && !strings.Contains(urls, "tls://") {
		if h, ok := plaintextRemote(urls); ok {
			w = append(w, "nats: credentials go in plaintext to "+h+"; use a tls:// URL or --nats-tls-ca")
		}
	}
	return w
}

// NATSPingInterval and NATSMaxPingsOut: how often a connection pings its
// server, and how many pings may go unanswered before the connection is
// taken as dead and reconnected. nats.go's defaults (2 minutes, 2) let a
// frozen server (SIGSTOP, a VM paused) pass for alive for up to 4 minutes,
// while the node's router counted every worker's silence against the
// worker and evicted them all (issue 29). With these a stalled server is
// noticed in 4–6 s, before a worker's default liveness window (17.5 s at
// a 5 s heartbeat) ends, and the router's link rule holds evictions back.
// The cost is one PING/PONG pair per 2 s per connection.
const (
	NATSPingInterval = 2 * time.Second
	NATSMaxPingsOut  = 2
)

// DialNATS connects to urls with o's credentials and TLS plus the caller's
// options (which come last, so they win). The error names the server with
// credentials redacted and never contains a secret.
func DialNATS(urls string, o NATS, extra ...nats.Option) (*nats.Conn, error) {
	opts, err := o.Options(urls)
	if err != nil {
		return nil, wrap("nats", urls, err, o.secrets(urls))
	}
	opts = append(opts, nats.PingInterval(NATSPingInterval), nats.MaxPingsOutstanding(NATSMaxPingsOut))
	nc, err := nats.Connect(urls, append(opts, extra...)...)
	if err != nil {
		return nil, wrap("nats", urls, err, o.secrets(urls))
	}
	return nc, nil
}

func urlHasUser(urls string) bool {
	for _, p := range strings.Split(urls, ",") {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			return true
		}
	}
	return false
}
