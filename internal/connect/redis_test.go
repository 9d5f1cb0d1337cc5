package connect_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/internal/connect/conntest"
)

const redisPassword = "r3dis-Pa55-Jk4"

func dialRedis(t *testing.T, urls string, o connect.Redis) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rdb, err := connect.DialRedis(ctx, urls, o)
	if err == nil {
		_ = rdb.Close()
	}
	return err
}

func TestRedisACLUser(t *testing.T) {
	t.Parallel()
	pki := conntest.NewPKI(t)
	srv := conntest.StartRedis(t, pki, conntest.RedisUser{Name: "alice", Password: redisPassword})
	url := "redis://" + srv.Addr

	for name, tc := range map[string]struct {
		url string
		o   connect.Redis
	}{
		"user and password": {url, connect.Redis{User: "alice", Password: redisPassword}},
		"password file":     {url, connect.Redis{User: "alice", PasswordFile: writeFile(t, "pw", redisPassword+"\n")}},
		"in the URL":        {"redis://alice:" + redisPassword + "@" + srv.Addr, connect.Redis{}},
		"bare host:port":    {srv.Addr, connect.Redis{User: "alice", Password: redisPassword}},
	} {
		if err := dialRedis(t, tc.url, tc.o); err != nil {
			t.Fatalf("%s: right credentials refused: %v", name, err)
		}
	}
	for name, tc := range map[string]struct {
		url  string
		o    connect.Redis
		want string
	}{
		"wrong password":        {url, connect.Redis{User: "alice", Password: wrongSecret}, "WRONGPASS"},
		"wrong password in URL": {"redis://alice:" + wrongSecret + "@" + srv.Addr, connect.Redis{}, "WRONGPASS"},
		"no credentials":        {url, connect.Redis{}, "NOAUTH"},
	} {
		err := dialRedis(t, tc.url, tc.o)
		if err == nil {
			t.Fatalf("%s: connected", name)
		}
		t.Logf("%s: %v", name, err)
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), srv.Addr) {
			t.Fatalf("%s: error %q, want %s naming %s", name, err, tc.want, srv.Addr)
		}
		assertNoSecret(t, err.Error(), wrongSecret, redisPassword)
	}
}

func TestRedisTLS(t *testing.T) {
	t.Parallel()
	pki := conntest.NewPKI(t)
	srv := conntest.StartRedis(t, pki, conntest.RedisUser{Name: "alice", Password: redisPassword})
	mtls := connect.TLS{CAFile: pki.CAFile, CertFile: pki.ClientCert, KeyFile: pki.ClientKey}
	auth := connect.Redis{User: "alice", Password: redisPassword, TLS: mtls}

	if err := dialRedis(t, "rediss://"+srv.TLSAddr, auth); err != nil {
		t.Fatalf("rediss:// with CA and client certificate refused: %v", err)
	}
	// TLS settings turn TLS on for a redis:// URL too.
	if err := dialRedis(t, "redis://"+srv.TLSAddr, auth); err != nil {
		t.Fatalf("redis:// with TLS settings refused: %v", err)
	}
	withName := auth
	withName.TLS.ServerName = "localhost"
	if err := dialRedis(t, srv.TLSAddr, withName); err != nil {
		t.Fatalf("server name localhost refused: %v", err)
	}

	noCA := auth
	noCA.TLS.CAFile = ""
	err := dialRedis(t, "rediss://"+srv.TLSAddr, noCA)
	t.Logf("without the CA: %v", err)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: %v, want a certificate verification error", err)
	}
	assertNoSecret(t, err.Error(), redisPassword)

	noCert := auth
	noCert.TLS.CertFile, noCert.TLS.KeyFile = "", ""
	if err := dialRedis(t, "rediss://"+srv.TLSAddr, noCert); err == nil {
		t.Fatal("client without a certificate connected to a server that requires one")
	} else {
		t.Logf("without a client certificate: %v", err)
		assertNoSecret(t, err.Error(), redisPassword)
	}

	wrongName := auth
	wrongName.TLS.ServerName = "redis.example"
	if err := dialRedis(t, "rediss://"+srv.TLSAddr, wrongName); err == nil {
		t.Fatal("a certificate for 127.0.0.1 was accepted for redis.example")
	}
}

func TestRedisClientKind(t *testing.T) {
	t.Parallel()
	one, err := connect.NewRedis("redis://127.0.0.1:6379/3", connect.Redis{})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	if c, ok := one.(*redis.Client); !ok || c.Options().DB != 3 {
		t.Fatalf("one address: %T, want *redis.Client on db 3", one)
	}
	for _, addrs := range []string{"127.0.0.1:7000,127.0.0.1:7001", "redis://a:" + redisPassword + "@h1:7000, redis://a:" + redisPassword + "@h2:7001"} {
		many, err := connect.NewRedis(addrs, connect.Redis{})
		if err != nil {
			t.Fatal(err)
		}
		cc, ok := many.(*redis.ClusterClient)
		if !ok {
			t.Fatalf("%d addresses: %T, want *redis.ClusterClient", 2, many)
		}
		if got := cc.Options().Addrs; len(got) != 2 {
			t.Fatalf("cluster seeds %q, want 2", got)
		}
		_ = many.Close()
	}
	seed, err := connect.NewRedis("rediss://127.0.0.1:7000", connect.Redis{Cluster: true, User: "a", Password: redisPassword})
	if err != nil {
		t.Fatal(err)
	}
	cc, ok := seed.(*redis.ClusterClient)
	if !ok || cc.Options().TLSConfig == nil || cc.Options().Username != "a" {
		t.Fatalf("Cluster with one rediss:// seed: %T, want a TLS cluster client with the user", seed)
	}
	_ = seed.Close()

	for name, addrs := range map[string]string{
		"db in a cluster":        "redis://h1:7000/2,redis://h2:7001",
		"different credentials":  "redis://a:" + redisPassword + "@h1:7000,redis://b:" + redisPassword + "@h2:7001",
		"mixed TLS":              "rediss://h1:7000,redis://h2:7001",
		"nothing":                " , ",
		"unparsable with secret": "redis://a:" + redisPassword + "@h:bad%port",
	} {
		_, err := connect.NewRedis(addrs, connect.Redis{})
		if !errors.Is(err, connect.ErrConfig) {
			t.Fatalf("%s: %v, want ErrConfig", name, err)
		}
		assertNoSecret(t, err.Error(), redisPassword)
	}
	_, err = connect.NewRedis("redis://a:"+redisPassword+"@h:6379", connect.Redis{Password: wrongSecret})
	if !errors.Is(err, connect.ErrConfig) {
		t.Fatalf("credentials twice: %v, want ErrConfig", err)
	}
	assertNoSecret(t, err.Error(), redisPassword, wrongSecret)
}
