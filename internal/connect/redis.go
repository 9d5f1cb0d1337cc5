package connect

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Redis holds the ACL credentials and TLS settings for a Redis connection.
// The address list passed with it is one URL (redis://, rediss:// for TLS,
// or host:port) for a single server, or several separated by commas for a
// Redis Cluster (the seed nodes).
type Redis struct {
	// User is the ACL user (default: "default"); credentials in the URL
	// (redis://user:pass@host) are the alternative, not an addition.
	User string `yaml:"user"`
	// Password, or PasswordFile holding it (one of the two).
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
	// Cluster makes a Redis Cluster client even from a single seed address
	// (several addresses always do).
	Cluster bool `yaml:"cluster"`
	TLS     TLS  `yaml:"tls"`
}

func (o Redis) secrets(urls string) []string {
	return append(urlSecrets(urls), o.Password)
}

// splitAddrs splits a comma-separated address list, dropping blanks.
func splitAddrs(urls string) []string {
	var out []string
	for _, p := range strings.Split(urls, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseOne reads one address: a redis:// or rediss:// URL, or host:port.
func parseOne(addr string) (*redis.Options, error) {
	if !strings.Contains(addr, "://") {
		addr = "redis://" + addr
	}
	opt, err := redis.ParseURL(addr)
	if err != nil {
		// url.Parse quotes the whole URL in its errors: name it redacted.
		return nil, fmt.Errorf("%w: redis address %s does not parse", ErrConfig, RedactURLs(addr))
	}
	return opt, nil
}

// credentials applies o's user and password over those from the URL.
func (o Redis) credentials(fromURL bool) (user, pw string, err error) {
	if o.Password != "" && o.PasswordFile != "" {
		return "", "", fmt.Errorf("%w: password and password file both set", ErrConfig)
	}
	set := o.User != "" || o.Password != "" || o.PasswordFile != ""
	if set && fromURL {
		return "", "", fmt.Errorf("%w: credentials both in the URL and as settings; give them once", ErrConfig)
	}
	pw = o.Password
	if o.PasswordFile != "" {
		if pw, err = readSecret("redis password", o.PasswordFile); err != nil {
			return "", "", err
		}
	}
	return o.User, pw, nil
}

// tlsFor merges o.TLS with what a rediss:// URL asked for (urlTLS, may be
// nil). It returns nil when neither wants TLS.
func (o Redis) tlsFor(urlTLS *tls.Config) (*tls.Config, error) {
	if urlTLS == nil && !o.TLS.Enabled() {
		return nil, nil
	}
	cfg, err := o.TLS.Config("redis")
	if err != nil {
		return nil, err
	}
	if urlTLS != nil {
		if cfg.ServerName == "" {
			cfg.ServerName = urlTLS.ServerName
		}
		cfg.InsecureSkipVerify = cfg.InsecureSkipVerify || urlTLS.InsecureSkipVerify
	}
	return cfg, nil
}

// NewRedis builds a client for urls without dialing (go-redis connects on
// first use): a plain client for one address, a Redis Cluster client for
// several (or with Cluster set). See DialRedis for a checked connection.
func NewRedis(urls string, o Redis) (redis.UniversalClient, error) {
	rdb, err := newRedis(urls, o)
	if err != nil {
		return nil, wrap("redis", urls, err, o.secrets(urls))
	}
	return rdb, nil
}

func newRedis(urls string, o Redis) (redis.UniversalClient, error) {
	addrs := splitAddrs(urls)
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: no redis address", ErrConfig)
	}
	if len(addrs) == 1 && !o.Cluster {
		opt, err := parseOne(addrs[0])
		if err != nil {
			return nil, err
		}
		user, pw, err := o.credentials(opt.Username != "" || opt.Password != "")
		if err != nil {
			return nil, err
		}
		if user != "" || pw != "" {
			opt.Username, opt.Password = user, pw
		}
		if opt.TLSConfig, err = o.tlsFor(opt.TLSConfig); err != nil {
			return nil, err
		}
		return redis.NewClient(opt), nil
	}
	// A cluster: the seeds share one set of credentials and one TLS
	// setting; the server name, unless given, is each node's own host.
	uo := &redis.UniversalOptions{IsClusterMode: true}
	var urlTLS *tls.Config
	for i, a := range addrs {
		opt, err := parseOne(a)
		if err != nil {
			return nil, err
		}
		if opt.DB != 0 {
			return nil, fmt.Errorf("%w: redis cluster address %s selects db %d; a cluster has only db 0", ErrConfig, RedactURLs(a), opt.DB)
		}
		if i > 0 && (opt.Username != uo.Username || opt.Password != uo.Password) {
			return nil, fmt.Errorf("%w: redis cluster addresses carry different credentials", ErrConfig)
		}
		if i > 0 && (opt.TLSConfig != nil) != (urlTLS != nil) {
			return nil, fmt.Errorf("%w: redis cluster addresses mix redis:// and rediss://", ErrConfig)
		}
		uo.Addrs = append(uo.Addrs, opt.Addr)
		uo.Username, uo.Password, urlTLS = opt.Username, opt.Password, opt.TLSConfig
	}
	user, pw, err := o.credentials(uo.Username != "" || uo.Password != "")
	if err != nil {
		return nil, err
	}
	if user != "" || pw != "" {
		uo.Username, uo.Password = user, pw
	}
	if urlTLS != nil {
		urlTLS = &tls.Config{InsecureSkipVerify: urlTLS.InsecureSkipVerify} // no single server name for many nodes
	}
	if uo.TLSConfig, err = o.tlsFor(urlTLS); err != nil {
		return nil, err
	}
	return redis.NewUniversalClient(uo), nil
}

// DialRedis builds the client and checks it with a PING (closing it again
// on failure). The error names the server with credentials redacted and
// never contains a secret.
func DialRedis(ctx context.Context, urls string, o Redis) (redis.UniversalClient, error) {
	rdb, err := NewRedis(urls, o)
	if err != nil {
		return nil, err
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, wrap("redis", urls, err, o.secrets(urls))
	}
	return rdb, nil
}

// Warnings lists what an operator should know about these settings.
func (o Redis) Warnings(urls string) []string {
	var w []string
	if o.TLS.InsecureSkipVerify {
		w = append(w, "redis: TLS certificate verification is off (insecure skip verify)")
	}
	sendsSecret := o.Password != "" || o.PasswordFile != "" || len(urlSecrets(urls)) > 0
	if sendsSecret && !o.TLS.Enabled() && !strings.Contains(urls, "rediss://") {
		if h, ok := plaintextRemote(urls); ok {
			w = append(w, "redis: the password goes in plaintext to "+h+"; use a rediss:// URL or --redis-tls-ca")
		}
	}
	return w
}
