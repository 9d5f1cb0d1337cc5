package connect_test

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/troupe-run/troupe/internal/connect"
)

// parse registers the flags of want on a fresh FlagSet, parses args and
// resolves.
func parse(t *testing.T, want connect.Want, args ...string) (connect.Settings, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var f connect.Flags
	f.Register(fs, want)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f.Resolve()
}

const fileConfig = `
nats:
  url: nats://file-host:4222
  user: file-user
  password: file-password
  tls:
    ca: /file/ca.pem
redis:
  url: redis://file-redis:6379
  user: file-redis-user
  password_file: /file/redis-password
  cluster: true
`

func TestFlagsPrecedenceFlagOverEnvOverFile(t *testing.T) {
	path := writeFile(t, "conn.yaml", fileConfig)
	t.Setenv(connect.EnvConfigFile, path)
	t.Setenv("TROUPE_NATS_PASSWORD", "env-password")
	t.Setenv("TROUPE_NATS_USER", "env-user")
	t.Setenv("TROUPE_REDIS_URL", "redis://env-redis:6379")
	t.Setenv("TROUPE_REDIS_PASSWORD", "env-redis-password")
	t.Setenv("TROUPE_REDIS_CLUSTER", "false")

	s, err := parse(t, connect.Want{NATS: true, Redis: true}, "--nats-user", "flag-user", "--redis-tls-ca", "/flag/ca.pem")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string][2]string{
		"nats user: flag over env":                  {s.NATS.User, "flag-user"},
		"nats password: env over file":              {s.NATS.Password, "env-password"},
		"nats url: file over default":               {s.NATSURL, "nats://file-host:4222"},
		"nats tls ca: file":                         {s.NATS.TLS.CAFile, "/file/ca.pem"},
		"redis url: env over file":                  {s.RedisURL, "redis://env-redis:6379"},
		"redis user: file":                          {s.Redis.User, "file-redis-user"},
		"redis password: env over file":             {s.Redis.Password, "env-redis-password"},
		"redis password file: its group is the env": {s.Redis.PasswordFile, ""},
		"redis tls ca: flag":                        {s.Redis.TLS.CAFile, "/flag/ca.pem"},
	} {
		if c[0] != c[1] {
			t.Errorf("%s: got %q, want %q", name, c[0], c[1])
		}
	}
	if s.Redis.Cluster {
		t.Error("redis cluster: TROUPE_REDIS_CLUSTER=false must win over the file's true")
	}

	// A flag's false still is a flag: it wins over the environment.
	t.Setenv("TROUPE_REDIS_CLUSTER", "true")
	s, err = parse(t, connect.Want{Redis: true}, "--redis-cluster=false")
	if err != nil || s.Redis.Cluster {
		t.Fatalf("--redis-cluster=false over env true: cluster %v, err %v", s.Redis.Cluster, err)
	}
}

func TestFlagsConfigFileFlagOverEnv(t *testing.T) {
	t.Setenv(connect.EnvConfigFile, writeFile(t, "env.yaml", "nats:\n  user: from-env-file\n"))
	s, err := parse(t, connect.Want{NATS: true}, "--conn-config", writeFile(t, "flag.yaml", "nats:\n  user: from-flag-file\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.NATS.User != "from-flag-file" {
		t.Fatalf("user %q, want the --conn-config file's", s.NATS.User)
	}
}

func TestFlagsDefaultsAndRepeatedRedis(t *testing.T) {
	s, err := parse(t, connect.Want{NATS: true, Redis: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.NATSURL != connect.NATSURLDefault || s.RedisURL != connect.RedisURLDefault {
		t.Fatalf("defaults: %q %q", s.NATSURL, s.RedisURL)
	}
	s, err = parse(t, connect.Want{Redis: true}, "--redis", "h1:7000,h2:7001", "--redis", "h3:7002")
	if err != nil {
		t.Fatal(err)
	}
	if s.RedisURL != "h1:7000,h2:7001,h3:7002" {
		t.Fatalf("repeated --redis: %q", s.RedisURL)
	}
	// Only the wanted servers' settings are resolved.
	if s.NATSURL != "" {
		t.Fatalf("NATS not wanted, got %q", s.NATSURL)
	}
}

func TestFlagsOptionalRedisOnlyFromTheFlag(t *testing.T) {
	t.Setenv("TROUPE_REDIS_URL", "redis://env-redis:6379")
	t.Setenv("TROUPE_REDIS_USER", "env-user")
	s, err := parse(t, connect.Want{OptionalRedis: true})
	if err != nil {
		t.Fatal(err)
	}
	if s.RedisURL != "" || s.Redis.User != "env-user" {
		t.Fatalf("optional redis: url %q user %q, want no url and the env user", s.RedisURL, s.Redis.User)
	}
	s, err = parse(t, connect.Want{OptionalRedis: true}, "--redis", "redis://flag:6379")
	if err != nil || s.RedisURL != "redis://flag:6379" {
		t.Fatalf("optional redis with --redis: %q %v", s.RedisURL, err)
	}
}

func TestFlagsBadInput(t *testing.T) {
	t.Setenv("TROUPE_NATS_TLS_INSECURE_SKIP_VERIFY", "maybe")
	if _, err := parse(t, connect.Want{NATS: true}); !errors.Is(err, connect.ErrConfig) ||
		!strings.Contains(err.Error(), "TROUPE_NATS_TLS_INSECURE_SKIP_VERIFY") {
		t.Fatalf("bad boolean variable: %v", err)
	}
	t.Setenv("TROUPE_NATS_TLS_INSECURE_SKIP_VERIFY", "")

	unknown := writeFile(t, "bad.yaml", "nats:\n  user: a\n  pasword: x\n")
	_, err := parse(t, connect.Want{NATS: true}, "--conn-config", unknown)
	if !errors.Is(err, connect.ErrConfig) || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "pasword") {
		t.Fatalf("unknown key: %v, want an error naming line 3 and the key", err)
	}
	mistyped := writeFile(t, "typed.yaml", "redis:\n  cluster: "+redisPassword+"\n")
	_, err = parse(t, connect.Want{Redis: true}, "--conn-config", mistyped)
	if !errors.Is(err, connect.ErrConfig) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("mistyped value: %v, want an error naming line 2", err)
	}
	assertNoSecret(t, err.Error(), redisPassword)

	if _, err := parse(t, connect.Want{NATS: true}, "--conn-config", "/nonexistent/conn.yaml"); !errors.Is(err, connect.ErrConfig) {
		t.Fatalf("missing file: %v", err)
	}
	if s, err := parse(t, connect.Want{NATS: true}, "--conn-config", writeFile(t, "empty.yaml", "")); err != nil || s.NATSURL != connect.NATSURLDefault {
		t.Fatalf("empty file: %+v %v", s, err)
	}
}

func TestFlagsUsageShowsNoSecretFromTheEnvironment(t *testing.T) {
	t.Setenv("TROUPE_NATS_PASSWORD", natsPassword)
	t.Setenv("TROUPE_REDIS_URL", "redis://u:"+redisPassword+"@h:6379")
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	var f connect.Flags
	f.Register(fs, connect.Want{NATS: true, Redis: true})
	var out bytes.Buffer
	fs.SetOutput(&out)
	fs.PrintDefaults()
	if !strings.Contains(out.String(), "-nats-password") {
		t.Fatalf("usage lacks the flags: %s", out.String())
	}
	assertNoSecret(t, out.String(), natsPassword, redisPassword)
}
