package connect_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/troupe-run/troupe/internal/connect"
	"github.com/troupe-run/troupe/internal/connect/conntest"
)

// Secrets the tests configure; none may appear in any error text.
const (
	natsPassword = "n4ts-pa55-Qv7"
	natsToken    = "tok-8Hf2kLq9"
	wrongSecret  = "wr0ng-S3cret-zz"
)

// assertNoSecret fails when text contains any of the secrets.
func assertNoSecret(t *testing.T, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			t.Fatalf("secret %q appears in %q", s[:2]+"…", text)
		}
	}
}

func dialOnce(url string, o connect.NATS) (*nats.Conn, error) {
	return connect.DialNATS(url, o, nats.Timeout(5*time.Second), nats.MaxReconnects(0), nats.RetryOnFailedConnect(false))
}

func writeFile(t *testing.T, name, content string) string {
	return conntest.WriteFile(t, name, content)
}

func TestNATSUserPassword(t *testing.T) {
	t.Parallel()
	url := conntest.StartNATS(t, func(o *server.Options) { o.Username, o.Password = "troupe", natsPassword })
	host := strings.TrimPrefix(url, "nats://")

	for name, tc := range map[string]struct {
		url string
		o   connect.NATS
	}{
		"flags":         {url, connect.NATS{User: "troupe", Password: natsPassword}},
		"password file": {url, connect.NATS{User: "troupe", PasswordFile: writeFile(t, "pw", natsPassword+"\n")}},
		"in the URL":    {"nats://troupe:" + natsPassword + "@" + host, connect.NATS{}},
	} {
		nc, err := dialOnce(tc.url, tc.o)
		if err != nil {
			t.Fatalf("%s: right credentials refused: %v", name, err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		nc.Close()
	}

	for name, tc := range map[string]struct {
		url string
		o   connect.NATS
	}{
		"wrong password":        {url, connect.NATS{User: "troupe", Password: wrongSecret}},
		"wrong password in URL": {"nats://troupe:" + wrongSecret + "@" + host, connect.NATS{}},
		"no credentials":        {url, connect.NATS{}},
	} {
		_, err := dialOnce(tc.url, tc.o)
		if err == nil {
			t.Fatalf("%s: connected", name)
		}
		msg := err.Error()
		t.Logf("%s: %v", name, err)
		if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(msg), "authorization") {
			t.Fatalf("%s: error %q does not say authorization failed", name, msg)
		}
		if !strings.Contains(msg, "127.0.0.1") {
			t.Fatalf("%s: error %q does not name the server", name, msg)
		}
		assertNoSecret(t, msg, wrongSecret, natsPassword)
	}
}

func TestNATSToken(t *testing.T) {
	t.Parallel()
	url := conntest.StartNATS(t, func(o *server.Options) { o.Authorization = natsToken })
	host := strings.TrimPrefix(url, "nats://")
	for _, o := range []connect.NATS{{Token: natsToken}, {TokenFile: writeFile(t, "tok", natsToken)}} {
		nc, err := dialOnce(url, o)
		if err != nil {
			t.Fatalf("right token refused: %v", err)
		}
		nc.Close()
	}
	// A token in the URL is its user part: hidden whole in the error.
	_, err := dialOnce("nats://"+wrongSecret+"@"+host, connect.NATS{})
	if err == nil {
		t.Fatal("wrong token connected")
	}
	assertNoSecret(t, err.Error(), wrongSecret, natsToken)
	if !strings.Contains(err.Error(), connect.Redacted+"@127.0.0.1") {
		t.Fatalf("error %q does not name the redacted server", err)
	}
	_, err = dialOnce(url, connect.NATS{Token: wrongSecret})
	if err == nil {
		t.Fatal("wrong token connected")
	}
	assertNoSecret(t, err.Error(), wrongSecret, natsToken)
}

func TestNATSNKey(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	url := conntest.StartNATS(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	nc, err := dialOnce(url, connect.NATS{NKeyFile: writeFile(t, "user.nk", string(seed))})
	if err != nil {
		t.Fatalf("nkey refused: %v", err)
	}
	nc.Close()

	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	_, err = dialOnce(url, connect.NATS{NKeyFile: writeFile(t, "other.nk", string(otherSeed))})
	if err == nil {
		t.Fatal("unknown nkey connected")
	}
	assertNoSecret(t, err.Error(), string(otherSeed), string(seed))

	_, err = dialOnce(url, connect.NATS{NKeyFile: filepath.Join(t.TempDir(), "missing.nk")})
	if !errors.Is(err, connect.ErrConfig) || !strings.Contains(err.Error(), "missing.nk") {
		t.Fatalf("missing seed file: %v, want a config error naming the file", err)
	}
}

// creds builds a .creds file for a user of account acc, signed by it.
func creds(t *testing.T, acc nkeys.KeyPair) (file string, seed []byte) {
	t.Helper()
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	seed, _ = user.Seed()
	ujwt, err := jwt.NewUserClaims(pub).Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := jwt.FormatUserConfig(ujwt, seed)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, "user.creds", string(b)), seed
}

func TestNATSCredsFile(t *testing.T) {
	t.Parallel()
	op, _ := nkeys.CreateOperator()
	opPub, _ := op.PublicKey()
	opJWT, err := jwt.NewOperatorClaims(opPub).Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	opClaims, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		t.Fatal(err)
	}
	acc, _ := nkeys.CreateAccount()
	accPub, _ := acc.PublicKey()
	accJWT, err := jwt.NewAccountClaims(accPub).Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	resolver := &server.MemAccResolver{}
	if err := resolver.Store(accPub, accJWT); err != nil {
		t.Fatal(err)
	}
	url := conntest.StartNATS(t, func(o *server.Options) {
		o.JetStream = false // operator mode would want a system account for it
		o.TrustedOperators, o.AccountResolver = []*jwt.OperatorClaims{opClaims}, resolver
	})
	file, _ := creds(t, acc)
	nc, err := dialOnce(url, connect.NATS{CredsFile: file})
	if err != nil {
		t.Fatalf("creds of a known account refused: %v", err)
	}
	nc.Close()

	stranger, _ := nkeys.CreateAccount()
	file, seed := creds(t, stranger)
	_, err = dialOnce(url, connect.NATS{CredsFile: file})
	if err == nil {
		t.Fatal("creds of an unknown account connected")
	}
	t.Logf("unknown account: %v", err)
	assertNoSecret(t, err.Error(), string(seed))
}

func TestNATSMutualTLS(t *testing.T) {
	t.Parallel()
	pki := conntest.NewPKI(t)
	url := conntest.StartNATS(t, func(o *server.Options) {
		o.TLSConfig, o.TLSVerify, o.TLSTimeout = pki.ServerTLS(t, true), true, 5
		o.Username, o.Password = "troupe", natsPassword
	})
	full := connect.NATS{User: "troupe", Password: natsPassword,
		TLS: connect.TLS{CAFile: pki.CAFile, CertFile: pki.ClientCert, KeyFile: pki.ClientKey}}
	nc, err := dialOnce(url, full)
	if err != nil {
		t.Fatalf("TLS with client certificate refused: %v", err)
	}
	if !nc.TLSRequired() {
		// The server said TLS and the client honoured it.
		t.Fatal("connection is not TLS")
	}
	nc.Close()

	noCert := full
	noCert.TLS.CertFile, noCert.TLS.KeyFile = "", ""
	if _, err := dialOnce(url, noCert); err == nil {
		t.Fatal("client without a certificate connected to a server that requires one")
	} else {
		t.Logf("without a client certificate: %v", err)
		assertNoSecret(t, err.Error(), natsPassword)
	}

	noCA := full
	noCA.TLS.CAFile = ""
	_, err = dialOnce(url, noCA)
	t.Logf("without the CA: %v", err)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("client without the CA: %v, want a certificate verification error", err)
	}
	assertNoSecret(t, err.Error(), natsPassword)
}

func TestNATSRefusesTwoKindsOfCredential(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		url string
		o   connect.NATS
	}{
		"user and token":        {"nats://127.0.0.1:1", connect.NATS{User: "a", Password: natsPassword, Token: natsToken}},
		"URL and user":          {"nats://a:" + natsPassword + "@127.0.0.1:1", connect.NATS{User: "a", Password: natsPassword}},
		"password and file":     {"nats://127.0.0.1:1", connect.NATS{User: "a", Password: natsPassword, PasswordFile: "/x"}},
		"cert without key":      {"nats://127.0.0.1:1", connect.NATS{TLS: connect.TLS{CertFile: "/c"}}},
		"password without user": {"nats://127.0.0.1:1", connect.NATS{Password: natsPassword}},
	} {
		_, err := connect.DialNATS(tc.url, tc.o)
		if !errors.Is(err, connect.ErrConfig) {
			t.Fatalf("%s: %v, want ErrConfig", name, err)
		}
		assertNoSecret(t, err.Error(), natsPassword, natsToken)
	}
}

func TestNATSWarnings(t *testing.T) {
	t.Parallel()
	if w := (connect.NATS{User: "a", Password: natsPassword}).Warnings("nats://nats.example:4222"); len(w) != 1 {
		t.Fatalf("password to a remote host without TLS: warnings %q, want one", w)
	}
	if w := (connect.NATS{User: "a", Password: natsPassword}).Warnings("nats://127.0.0.1:4222"); len(w) != 0 {
		t.Fatalf("password over loopback: warnings %q, want none", w)
	}
	if w := (connect.NATS{User: "a", Password: natsPassword, TLS: connect.TLS{CAFile: "/ca"}}).Warnings("nats://nats.example:4222"); len(w) != 0 {
		t.Fatalf("password over TLS: warnings %q, want none", w)
	}
	if w := (connect.NATS{TLS: connect.TLS{InsecureSkipVerify: true}}).Warnings("tls://nats.example:4222"); len(w) != 1 {
		t.Fatalf("insecure skip verify: warnings %q, want one", w)
	}
	for _, w := range (connect.NATS{}).Warnings("nats://" + natsToken + "@nats.example:4222") {
		assertNoSecret(t, w, natsToken)
	}
}

func TestRedactURLs(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://u:" + natsPassword + "@h:4222":            "nats://u:xxxxx@h:4222",
		"nats://" + natsToken + "@h:4222":                 "nats://xxxxx@h:4222",
		"redis://:" + natsPassword + "@h:6379/2":          "redis://:xxxxx@h:6379/2",
		"rediss://a:" + natsPassword + "@h1,redis://b@h2": "rediss://a:xxxxx@h1,redis://xxxxx@h2",
		"127.0.0.1:6379":                                  "127.0.0.1:6379",
		"redis://u:" + natsPassword + "@h:bad%port":       "xxxxx@h:bad%port",
	} {
		if got := connect.RedactURLs(in); got != want {
			t.Errorf("RedactURLs(…) = %q, want %q", got, want)
		}
	}
}
