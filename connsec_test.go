package troupe_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/internal/connect/conntest"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// Secrets of the secured servers; none may show in a log line or an error.
const (
	secNATSPassword  = "nats-Secret-7Yq2"
	secRedisPassword = "redis-Secret-4Kd9"
	secWrong         = "wrong-Secret-0Pz5"
)

// lockedBuffer collects a node's log output from many goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// securedServers starts a NATS server that requires a password and a
// client certificate, and a redis-server with the default user off, ACL
// user alice and a TLS port that requires client certificates.
type securedServers struct {
	natsURL, redisURL string
	natsAuth          troupe.NATSAuth
	redisAuth         troupe.RedisAuth
}

func startSecuredServers(t *testing.T) *securedServers {
	t.Helper()
	pki := conntest.NewPKI(t)
	natsURL := conntest.StartNATS(t, func(o *server.Options) {
		o.TLSConfig, o.TLSVerify, o.TLSTimeout = pki.ServerTLS(t, true), true, 5
		o.Username, o.Password = "troupe", secNATSPassword
	})
	rs := conntest.StartRedis(t, pki, conntest.RedisUser{Name: "alice", Password: secRedisPassword})
	pwFile := conntest.WriteFile(t, "redis-password", secRedisPassword+"\n")
	mtls := troupe.TLSSettings{CAFile: pki.CAFile, CertFile: pki.ClientCert, KeyFile: pki.ClientKey}
	return &securedServers{
		natsURL: natsURL, redisURL: "rediss://" + rs.TLSAddr,
		natsAuth:  troupe.NATSAuth{User: "troupe", Password: secNATSPassword, TLS: mtls},
		redisAuth: troupe.RedisAuth{User: "alice", PasswordFile: pwFile, TLS: mtls},
	}
}

func assertNoSecrets(t *testing.T, what, text string) {
	t.Helper()
	for _, s := range []string{secNATSPassword, secRedisPassword, secWrong} {
		if strings.Contains(text, s) {
			t.Fatalf("%s contains a secret (%s…)", what, s[:4])
		}
	}
}

func TestNodeRunsAJobOverTLSWithAuthAndLogsNoSecret(t *testing.T) {
	srv := startSecuredServers(t)
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	pools, err := parseTestPools()
	if err != nil {
		t.Fatal(err)
	}
	// The node takes its NATS password from the URL (the log line naming
	// the server must hide it), the worker from its settings; Redis reads
	// the password from a file.
	nodeURL := strings.Replace(srv.natsURL, "tls://", "tls://troupe:"+secNATSPassword+"@", 1)
	node, err := troupe.NewNode(troupe.Config{NodeID: "secure-node",
		NATSURL: nodeURL, NATSAuth: troupe.NATSAuth{TLS: srv.natsAuth.TLS}, RedisURL: srv.redisURL, RedisAuth: srv.redisAuth,
		Pools: pools, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := node.Start(ctx); err != nil {
		t.Fatalf("node over TLS with auth: %v", err)
	}
	defer func() { _ = node.Stop(context.Background()) }()

	nc, err := connect.DialNATS(srv.natsURL, srv.natsAuth.Conn(), nats.Name("troupe-worker secure-w1"))
	if err != nil {
		t.Fatalf("worker over TLS with auth: %v", err)
	}
	defer nc.Close()
	w, err := worker.Start(nc, worker.Config{ID: "secure-w1", Pool: "echo", Topics: []string{"job.echo"},
		Direct: true, SubjectPrefix: node.Subjects().Prefix(), Handler: worker.Echo, Heartbeat: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := 0; ; i++ {
		if ws, err := node.Workers(); err == nil && len(ws) > 0 {
			break
		}
		if i == 1000 {
			t.Fatal("router never saw the worker")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := node.Submit(ctx, &capv1.JobRequest{JobId: "secure-1", Topic: "job.echo", ContextPtr: "redis://ctx:secure-1"}); err != nil {
		t.Fatal(err)
	}
	var last jobstate.State
	for i := 0; ; i++ {
		r, err := node.Record(ctx, "secure-1")
		if err == nil && r.State == jobstate.StateSucceeded {
			break
		}
		if err == nil {
			last = r.State
		}
		if i == 1500 {
			t.Fatalf("job not SUCCEEDED after 15 s (state %q)", last)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = node.Stop(context.Background())
	out := logs.String()
	if !strings.Contains(out, "node started") || !strings.Contains(out, "troupe:xxxxx@127.0.0.1") {
		t.Fatalf("no node logs captured: %q", out)
	}
	assertNoSecrets(t, "the node's log", out)
}

func TestNodeWithWrongCredentialsFailsWithoutNamingTheSecret(t *testing.T) {
	srv := startSecuredServers(t)
	pools, err := parseTestPools()
	if err != nil {
		t.Fatal(err)
	}
	wrongNATS := srv.natsAuth
	wrongNATS.Password = secWrong
	wrongRedis := srv.redisAuth
	wrongRedis.PasswordFile, wrongRedis.Password = "", secWrong
	for name, tc := range map[string]struct {
		natsURL, redisURL string
		nats              troupe.NATSAuth
		redis             troupe.RedisAuth
		want              string
	}{
		"wrong NATS password":         {srv.natsURL, srv.redisURL, wrongNATS, srv.redisAuth, "Authorization"},
		"wrong Redis password":        {srv.natsURL, srv.redisURL, srv.natsAuth, wrongRedis, "WRONGPASS"},
		"wrong Redis password in URL": {srv.natsURL, strings.Replace(srv.redisURL, "rediss://", "rediss://alice:"+secWrong+"@", 1), srv.natsAuth, troupe.RedisAuth{TLS: srv.redisAuth.TLS}, "WRONGPASS"},
		"NATS without client TLS cert": {srv.natsURL, srv.redisURL, troupe.NATSAuth{User: "troupe", Password: secNATSPassword,
			TLS: troupe.TLSSettings{CAFile: srv.natsAuth.TLS.CAFile}}, srv.redisAuth, "tls"},
	} {
		var logs lockedBuffer
		node, err := troupe.NewNode(troupe.Config{NodeID: "secure-node", NATSURL: tc.natsURL, NATSAuth: tc.nats,
			RedisURL: tc.redisURL, RedisAuth: tc.redis, Pools: pools,
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err = node.Start(ctx)
		cancel()
		_ = node.Stop(context.Background())
		if err == nil {
			t.Fatalf("%s: node started", name)
		}
		t.Logf("%s: %v", name, err)
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "127.0.0.1") {
			t.Fatalf("%s: error %q, want %q naming the server", name, err, tc.want)
		}
		assertNoSecrets(t, name+": the error", err.Error())
		assertNoSecrets(t, name+": the node's log", logs.String())
	}
}
