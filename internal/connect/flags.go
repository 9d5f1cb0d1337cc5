package connect

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Defaults when no flag, variable or file names a server.
const (
	NATSURLDefault  = "nats://127.0.0.1:4222"
	RedisURLDefault = "redis://127.0.0.1:6379"
	// EnvConfigFile names the connection config file when --conn-config is not given.
	EnvConfigFile = "TROUPE_CONN_CONFIG"
)

// Settings are the resolved connection settings of a command.
type Settings struct {
	// NATSURL is one URL or a comma-separated list (one cluster).
	NATSURL string
	NATS    NATS
	// RedisURL is one address, or several separated by commas (a cluster).
	RedisURL string
	Redis    Redis
}

// Want says which servers a command talks to: only their flags are
// registered and resolved.
type Want struct {
	NATS, Redis bool
	// OptionalRedis: Redis is used only when --redis is given (no default
	// address, and no address from the environment or the file).
	OptionalRedis bool
}

// file is the layout of the --conn-config YAML file.
type file struct {
	NATS struct {
		URL  string `yaml:"url"`
		NATS `yaml:",inline"`
	} `yaml:"nats"`
	Redis struct {
		URL   string `yaml:"url"`
		Redis `yaml:",inline"`
	} `yaml:"redis"`
}

// LoadFile reads a connection config file. Unknown keys are errors that
// name their line.
func LoadFile(path string) (Settings, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Settings{}, fmt.Errorf("%w: connection config: %w", ErrConfig, err)
	}
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) { // io.EOF: an empty file
		// yaml.v3 names the line; it quotes a mistyped value between
		// backquotes, which may be a secret: hide it.
		msg := quotedValue.ReplaceAllString(err.Error(), "`"+Redacted+"`")
		return Settings{}, fmt.Errorf("%w: connection config %s: %s", ErrConfig, path, msg)
	}
	return Settings{NATSURL: f.NATS.URL, NATS: f.NATS.NATS, RedisURL: f.Redis.URL, Redis: f.Redis.Redis}, nil
}

var quotedValue = regexp.MustCompile("`[^`]*`")

// setting is one connection setting: its flag, its variable and where it
// lives in Settings. Settings of one group (a URL, a password and its file)
// come from one source together, so a password file from the config file
// never meets a password from the environment.
type setting struct {
	flag, env, usage string
	group            string
	redis            bool // a Redis setting (else NATS)
	str              func(*Settings) *string
	boolean          func(*Settings) *bool
}

var settings = []setting{
	{flag: "nats", env: "TROUPE_NATS_URL", group: "nats-url", usage: "NATS URL, or several separated by commas (default " + NATSURLDefault + ")",
		str: func(s *Settings) *string { return &s.NATSURL }},
	{flag: "nats-user", env: "TROUPE_NATS_USER", group: "nats-user", usage: "NATS user (with --nats-password)",
		str: func(s *Settings) *string { return &s.NATS.User }},
	{flag: "nats-password", env: "TROUPE_NATS_PASSWORD", group: "nats-password", usage: "NATS password (prefer the variable or --nats-password-file: flags show in ps)",
		str: func(s *Settings) *string { return &s.NATS.Password }},
	{flag: "nats-password-file", env: "TROUPE_NATS_PASSWORD_FILE", group: "nats-password", usage: "file holding the NATS password",
		str: func(s *Settings) *string { return &s.NATS.PasswordFile }},
	{flag: "nats-token", env: "TROUPE_NATS_TOKEN", group: "nats-token", usage: "NATS auth token (prefer the variable or --nats-token-file)",
		str: func(s *Settings) *string { return &s.NATS.Token }},
	{flag: "nats-token-file", env: "TROUPE_NATS_TOKEN_FILE", group: "nats-token", usage: "file holding the NATS auth token",
		str: func(s *Settings) *string { return &s.NATS.TokenFile }},
	{flag: "nats-nkey", env: "TROUPE_NATS_NKEY", group: "nats-nkey", usage: "NATS user NKey seed file",
		str: func(s *Settings) *string { return &s.NATS.NKeyFile }},
	{flag: "nats-creds", env: "TROUPE_NATS_CREDS", group: "nats-creds", usage: "NATS credentials (.creds) file: user JWT and NKey seed",
		str: func(s *Settings) *string { return &s.NATS.CredsFile }},
	{flag: "nats-tls-ca", env: "TROUPE_NATS_TLS_CA", group: "nats-tls-ca", usage: "PEM CA bundle that verifies the NATS server (turns TLS on)",
		str: func(s *Settings) *string { return &s.NATS.TLS.CAFile }},
	{flag: "nats-tls-cert", env: "TROUPE_NATS_TLS_CERT", group: "nats-tls-cert", usage: "client certificate for NATS (mutual TLS; with --nats-tls-key)",
		str: func(s *Settings) *string { return &s.NATS.TLS.CertFile }},
	{flag: "nats-tls-key", env: "TROUPE_NATS_TLS_KEY", group: "nats-tls-cert", usage: "the NATS client certificate's key",
		str: func(s *Settings) *string { return &s.NATS.TLS.KeyFile }},
	{flag: "nats-tls-server-name", env: "TROUPE_NATS_TLS_SERVER_NAME", group: "nats-tls-server-name", usage: "name to verify in the NATS server's certificate (default: the host dialed)",
		str: func(s *Settings) *string { return &s.NATS.TLS.ServerName }},
	{flag: "nats-tls-insecure-skip-verify", env: "TROUPE_NATS_TLS_INSECURE_SKIP_VERIFY", group: "nats-tls-insecure", usage: "accept any NATS server certificate (tests only; logged)",
		boolean: func(s *Settings) *bool { return &s.NATS.TLS.InsecureSkipVerify }},

	{redis: true, flag: "redis", env: "TROUPE_REDIS_URL", group: "redis-url", usage: "Redis URL (redis://, rediss:// for TLS); several (comma-separated or repeated) make a Redis Cluster client (default " + RedisURLDefault + ")",
		str: func(s *Settings) *string { return &s.RedisURL }},
	{redis: true, flag: "redis-user", env: "TROUPE_REDIS_USER", group: "redis-user", usage: "Redis ACL user",
		str: func(s *Settings) *string { return &s.Redis.User }},
	{redis: true, flag: "redis-password", env: "TROUPE_REDIS_PASSWORD", group: "redis-password", usage: "Redis password (prefer the variable or --redis-password-file: flags show in ps)",
		str: func(s *Settings) *string { return &s.Redis.Password }},
	{redis: true, flag: "redis-password-file", env: "TROUPE_REDIS_PASSWORD_FILE", group: "redis-password", usage: "file holding the Redis password",
		str: func(s *Settings) *string { return &s.Redis.PasswordFile }},
	{redis: true, flag: "redis-cluster", env: "TROUPE_REDIS_CLUSTER", group: "redis-cluster", usage: "use a Redis Cluster client even with one seed address",
		boolean: func(s *Settings) *bool { return &s.Redis.Cluster }},
	{redis: true, flag: "redis-tls-ca", env: "TROUPE_REDIS_TLS_CA", group: "redis-tls-ca", usage: "PEM CA bundle that verifies the Redis server (turns TLS on)",
		str: func(s *Settings) *string { return &s.Redis.TLS.CAFile }},
	{redis: true, flag: "redis-tls-cert", env: "TROUPE_REDIS_TLS_CERT", group: "redis-tls-cert", usage: "client certificate for Redis (mutual TLS; with --redis-tls-key)",
		str: func(s *Settings) *string { return &s.Redis.TLS.CertFile }},
	{redis: true, flag: "redis-tls-key", env: "TROUPE_REDIS_TLS_KEY", group: "redis-tls-cert", usage: "the Redis client certificate's key",
		str: func(s *Settings) *string { return &s.Redis.TLS.KeyFile }},
	{redis: true, flag: "redis-tls-server-name", env: "TROUPE_REDIS_TLS_SERVER_NAME", group: "redis-tls-server-name", usage: "name to verify in the Redis server's certificate (default: the host dialed)",
		str: func(s *Settings) *string { return &s.Redis.TLS.ServerName }},
	{redis: true, flag: "redis-tls-insecure-skip-verify", env: "TROUPE_REDIS_TLS_INSECURE_SKIP_VERIFY", group: "redis-tls-insecure", usage: "accept any Redis server certificate (tests only; logged)",
		boolean: func(s *Settings) *bool { return &s.Redis.TLS.InsecureSkipVerify }},
}

// Flags registers the connection flags on a FlagSet and resolves them,
// after parsing, against the environment and the config file:
// a flag given on the command line > its TROUPE_* variable > the
// --conn-config file (or TROUPE_CONN_CONFIG) > the default.
//
// Flag defaults are empty, so -h never prints a secret from the
// environment.
type Flags struct {
	fs   *flag.FlagSet
	want Want
	cli  Settings
	file string
}

// Register adds the flags of the servers in want to fs.
func (f *Flags) Register(fs *flag.FlagSet, want Want) {
	f.fs, f.want = fs, want
	if want == (Want{}) {
		return // a command that dials nothing takes no connection flags
	}
	fs.StringVar(&f.file, "conn-config", "", "YAML file of NATS/Redis connection settings (env "+EnvConfigFile+"); flags and variables win over it")
	for _, s := range settings {
		if !f.wants(s) {
			continue
		}
		usage := s.usage + " (env " + s.env + ")"
		if s.flag == "redis" && want.OptionalRedis {
			usage = "Redis URL (redis://, rediss:// for TLS; several make a cluster client); Redis is used only when this flag is given"
		}
		switch {
		case s.flag == "redis":
			fs.Var(&addrList{dst: s.str(&f.cli)}, s.flag, usage)
		case s.boolean != nil:
			fs.BoolVar(s.boolean(&f.cli), s.flag, false, usage)
		default:
			fs.StringVar(s.str(&f.cli), s.flag, "", usage)
		}
	}
}

func (f *Flags) wants(s setting) bool {
	if s.redis {
		return f.want.Redis || f.want.OptionalRedis
	}
	return f.want.NATS
}

// Resolve returns the settings after fs.Parse: each group from the first
// source that sets any of it (command line, environment, file), then the
// default addresses.
func (f *Flags) Resolve() (Settings, error) {
	if f.fs == nil {
		return Settings{}, errors.New("connect: Flags.Resolve before Register")
	}
	if f.want == (Want{}) {
		return Settings{}, nil
	}
	given := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	path := f.file
	if !given["conn-config"] {
		path = os.Getenv(EnvConfigFile)
	}
	var fromFile Settings
	if path != "" {
		var err error
		if fromFile, err = LoadFile(path); err != nil {
			return Settings{}, err
		}
	}
	fromEnv, envSet, err := settingsFromEnv()
	if err != nil {
		return Settings{}, err
	}
	var out Settings
	groupSrc := map[string]*Settings{}
	for _, s := range settings {
		if !f.wants(s) {
			continue
		}
		if _, done := groupSrc[s.group]; done {
			continue
		}
		src := &fromFile
		for _, o := range settings {
			if o.group != s.group {
				continue
			}
			if given[o.flag] {
				src = &f.cli
				break
			}
			if envSet[o.env] {
				src = &fromEnv
			}
		}
		if f.want.OptionalRedis && s.group == "redis-url" {
			src = &f.cli // the address only from --redis
		}
		groupSrc[s.group] = src
	}
	for _, s := range settings {
		src, ok := groupSrc[s.group]
		if !ok {
			continue
		}
		if s.boolean != nil {
			*s.boolean(&out) = *s.boolean(src)
		} else {
			*s.str(&out) = *s.str(src)
		}
	}
	if f.want.NATS && out.NATSURL == "" {
		out.NATSURL = NATSURLDefault
	}
	if f.want.Redis && !f.want.OptionalRedis && out.RedisURL == "" {
		out.RedisURL = RedisURLDefault
	}
	return out, nil
}

// settingsFromEnv reads every setting's variable; envSet says which were
// non-empty.
func settingsFromEnv() (Settings, map[string]bool, error) {
	var out Settings
	set := map[string]bool{}
	for _, s := range settings {
		v := os.Getenv(s.env)
		if v == "" {
			continue
		}
		set[s.env] = true
		if s.boolean != nil {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return Settings{}, nil, fmt.Errorf("%w: %s: want true or false", ErrConfig, s.env)
			}
			*s.boolean(&out) = b
		} else {
			*s.str(&out) = v
		}
	}
	return out, set, nil
}

// addrList is the repeatable --redis flag: each value may itself be a
// comma-separated list.
type addrList struct{ dst *string }

func (a *addrList) String() string {
	if a == nil || a.dst == nil {
		return ""
	}
	return RedactURLs(*a.dst)
}

func (a *addrList) Set(v string) error {
	if *a.dst != "" {
		*a.dst += ","
	}
	*a.dst += strings.TrimSpace(v)
	return nil
}
