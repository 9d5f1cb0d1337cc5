package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/troupe-run/troupe/internal/connect/conntest"
)

const (
	cliRedisPassword = "cli-redis-Secret-3Fw"
	cliNATSPassword  = "cli-nats-Secret-8Rt"
	cliWrong         = "cli-wrong-Secret-1Xc"
)

func assertNoCLISecret(t *testing.T, what, text string) {
	t.Helper()
	for _, s := range []string{cliRedisPassword, cliNATSPassword, cliWrong} {
		if strings.Contains(text, s) {
			t.Fatalf("%s contains a secret (%s…)", what, s[:5])
		}
	}
}

func writeTemp(t *testing.T, name, content string) string {
	return conntest.WriteFile(t, name, content)
}

// The CLI takes its Redis address, user and TLS from a --conn-config file
// and its password from a file named in the environment, and reaches an
// ACL- and mutual-TLS-protected Redis with them.
func TestCLIDialsWithFileAndEnvironmentSettings(t *testing.T) {
	pki := conntest.NewPKI(t)
	rs := conntest.StartRedis(t, pki, conntest.RedisUser{Name: "alice", Password: cliRedisPassword})
	conf := writeTemp(t, "conn.yaml", "redis:\n  url: rediss://"+rs.TLSAddr+"\n  user: alice\n  tls:\n"+
		"    ca: "+pki.CAFile+"\n    cert: "+pki.ClientCert+"\n    key: "+pki.ClientKey+"\n")
	t.Setenv("TROUPE_REDIS_PASSWORD_FILE", writeTemp(t, "pw", cliRedisPassword+"\n"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The flags `troupe node` dials Redis with.
	dial := func(args ...string) error {
		fs := newFlags("node")
		var c common
		c.register(fs, false, true)
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		rdb, err := c.dialRedis(ctx)
		if err != nil {
			return err
		}
		defer rdb.Close()
		return rdb.Set(ctx, "clitest:probe", "1", time.Minute).Err()
	}
	if err := dial("--conn-config", conf); err != nil {
		t.Fatalf("dial over TLS with ACL: %v", err)
	}

	// A wrong password on the command line beats the file, fails, and is
	// not in the error.
	err := dial("--conn-config", conf, "--redis-password", cliWrong)
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("wrong --redis-password: %v, want WRONGPASS", err)
	}
	assertNoCLISecret(t, "the dial's error", err.Error())
	err = dial("--redis", "rediss://alice:"+cliWrong+"@"+rs.TLSAddr, "--conn-config", conf)
	if err == nil || !strings.Contains(err.Error(), "give them once") {
		t.Fatalf("credentials twice (URL and file): %v, want a clear refusal", err)
	}
	assertNoCLISecret(t, "the dial's error", err.Error())
}

func TestCLINATSCommandsNameNoSecret(t *testing.T) {
	t.Parallel()
	url := conntest.StartNATS(t, func(o *server.Options) { o.Username, o.Password = "troupe", cliNATSPassword })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for name, args := range map[string][]string{
		"submit, wrong password":    {"--nats", url, "--nats-user", "troupe", "--nats-password", cliWrong, "--topic", "job.echo"},
		"submit, password in URL":   {"--nats", strings.Replace(url, "nats://", "nats://troupe:"+cliWrong+"@", 1), "--topic", "job.echo"},
		"submit, token in URL":      {"--nats", strings.Replace(url, "nats://", "nats://"+cliWrong+"@", 1), "--topic", "job.echo"},
		"submit, password file bad": {"--nats", url, "--nats-user", "troupe", "--nats-password-file", "/nonexistent/pw"},
	} {
		err := runSubmit(ctx, append([]string{"--bus"}, args...))
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
		t.Logf("%s: %v", name, err)
		assertNoCLISecret(t, name, err.Error())
	}
	// Right credentials pass the connection step (the publish then fails:
	// no node made the streams).
	err := runSubmit(ctx, []string{"--bus", "--nats", url, "--nats-user", "troupe", "--nats-password", cliNATSPassword, "--id", "job-1"})
	if err == nil || strings.Contains(err.Error(), "connect: nats") {
		t.Fatalf("right credentials: %v, want to get past connecting", err)
	}
}
