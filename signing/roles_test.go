package signing_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/troupe-run/troupe/signing"
)

func TestKeySetRolesAndScopes(t *testing.T) {
	t.Parallel()
	node, w1, cli, op := newKey(t), newKey(t), newKey(t), newKey(t)
	file := "node-*: {role: node, keys: [" + quote(node.pub) + "]}\n" +
		"w-1:\n  role: worker\n  pools: [default]\n  workers: [w-1b]\n  keys: |\n" + indentN(w1.pub, "    ") +
		"ci: {role: client, tenants: [tenantA], keys: " + quote(cli.pub) + "}\n" +
		"alice: {role: operator, keys: [" + quote(op.pub) + "]}\n"
	ks, err := signing.ParseKeySet([]byte(file))
	if err != nil {
		t.Fatalf("%v\n%s", err, file)
	}
	if !ks.Roled() {
		t.Error("a key set with roles reports Roled false")
	}
	p, ok := ks.Principal("node-7")
	if !ok || p.Role != signing.RoleNode || p.Sender != "node-7" || !p.ForTenant("anyone") || p.SpeaksFor("w-1") {
		t.Errorf("node-7: %+v %v", p, ok)
	}
	w, _ := ks.Principal("w-1")
	switch {
	case !w.Is(signing.RoleWorker) || w.Is(signing.RoleNode, signing.RoleClient):
		t.Errorf("worker roles: %+v", w)
	case !w.SpeaksFor("w-1") || !w.SpeaksFor("w-1b") || w.SpeaksFor("w-2") || w.SpeaksFor(""):
		t.Errorf("worker ids: %+v", w)
	case !w.InPool("default") || w.InPool("secure"):
		t.Errorf("worker pools: %+v", w)
	case w.ForTenant("tenantA"):
		t.Errorf("a worker may submit for a tenant: %+v", w)
	}
	c, _ := ks.Principal("ci")
	if !c.ForTenant("tenantA") || c.ForTenant("tenantB") || c.InPool("default") || c.SpeaksFor("ci") {
		t.Errorf("client scope: %+v", c)
	}
	o, _ := ks.Principal("alice")
	if !o.ForTenant("tenantB") || o.Is(signing.RoleNode) {
		t.Errorf("operator: %+v", o)
	}
	if _, ok := ks.Principal("mallory"); ok {
		t.Error("an unlisted sender has a principal")
	}
	// VerifyPrincipal returns the signer's principal.
	v := signing.NewVerifier(ks)
	pkt := request("w-1")
	raw, err := w1.signer.Seal(pkt)
	if err != nil {
		t.Fatal(err)
	}
	got, err := v.VerifyPrincipal(decode(t, raw), raw)
	if err != nil || got.Sender != "w-1" || got.Role != signing.RoleWorker {
		t.Errorf("VerifyPrincipal: %+v %v", got, err)
	}
}

func TestKeySetWildcardScopes(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	ks, err := signing.ParseKeySet([]byte("w-*: {role: worker, pools: ['*'], keys: " + quote(k.pub) + "}\n" +
		"admin: {role: client, tenants: ['*'], keys: " + quote(k.pub) + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	w, _ := ks.Principal("w-9")
	c, _ := ks.Principal("admin")
	if !w.InPool("anything") || !w.SpeaksFor("w-9") || w.SpeaksFor("w-8") || !c.ForTenant("anyone") {
		t.Errorf("wildcards: %+v %+v", w, c)
	}
}

// An entry of keys alone is a legacy entry: in a file without roles it may
// act as every role (how signatures worked before roles); in a file with
// roles it is refused, naming its line.
func TestKeySetLegacyEntries(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	ks, err := signing.ParseKeySet([]byte("old: " + quote(k.pub) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := ks.Principal("old")
	if ks.Roled() || !p.Legacy() || !p.Is(signing.RoleNode) || !p.SpeaksFor("w-2") || !p.InPool("x") || !p.ForTenant("t") {
		t.Errorf("legacy: %+v", p)
	}
	_, err = signing.ParseKeySet([]byte("n: {role: node, keys: " + quote(k.pub) + "}\nold: " + quote(k.pub) + "\n"))
	var kse *signing.KeySetError
	if !errors.As(err, &kse) || kse.Line != 2 || kse.Sender != "old" || !strings.Contains(err.Error(), "no role") {
		t.Errorf("mixed file: %v", err)
	}
}

func TestKeySetRoleErrors(t *testing.T) {
	t.Parallel()
	q := quote(newKey(t).pub)
	for _, tc := range []struct{ name, file, contains string }{
		{"no role", "a: {keys: " + q + "}\n", "no role"},
		{"bad role", "a: {role: admin, keys: " + q + "}\n", `role "admin"`},
		{"no keys", "a: {role: node}\n", "no keys"},
		{"worker without pools", "a: {role: worker, keys: " + q + "}\n", "needs pools"},
		{"client without tenants", "a: {role: client, keys: " + q + "}\n", "needs tenants"},
		{"pools on a client", "a: {role: client, tenants: [t], pools: [p], keys: " + q + "}\n", "for role worker"},
		{"tenants on a node", "a: {role: node, tenants: [t], keys: " + q + "}\n", "for role client"},
		{"empty pool", "a: {role: worker, pools: [''], keys: " + q + "}\n", "non-empty"},
		{"unknown key", "a: {role: node, key: " + q + "}\n", `unknown key "key"`},
		{"twice", "a: {role: node, role: node, keys: " + q + "}\n", "listed twice"},
	} {
		_, err := signing.ParseKeySet([]byte(tc.file))
		if !errors.Is(err, signing.ErrInvalidKeySet) || !strings.Contains(err.Error(), tc.contains) ||
			!strings.Contains(err.Error(), `sender "a"`) {
			t.Errorf("%s: %v (want %q)", tc.name, err, tc.contains)
		}
	}
}

func TestMessageSignature(t *testing.T) {
	t.Parallel()
	node, w := newKey(t), newKey(t)
	ks, err := signing.ParseKeySet([]byte("n1: {role: node, keys: " + quote(node.pub) + "}\n" +
		"w: {role: worker, pools: [p], keys: " + quote(w.pub) + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	v := signing.NewVerifier(ks)
	at := time.Now()
	body := []byte(`{"tenant":"a","limit":5}`)
	ts, sig, err := node.signer.SignMessage("troupe.node.n2.waitlist", at, body)
	if err != nil {
		t.Fatal(err)
	}
	p, when, err := v.VerifyMessage("troupe.node.n2.waitlist", "n1", ts, sig, body)
	if err != nil || p.Role != signing.RoleNode || !when.Equal(time.Unix(0, at.UnixNano())) {
		t.Fatalf("verify: %+v %v %v", p, when, err)
	}
	for name, check := range map[string]func() error{
		"other subject": func() error { _, _, e := v.VerifyMessage("troupe.node.n3.waitlist", "n1", ts, sig, body); return e },
		"other body": func() error {
			_, _, e := v.VerifyMessage("troupe.node.n2.waitlist", "n1", ts, sig, []byte("{}"))
			return e
		},
		"other time":   func() error { _, _, e := v.VerifyMessage("troupe.node.n2.waitlist", "n1", ts+"1", sig, body); return e },
		"other sender": func() error { _, _, e := v.VerifyMessage("troupe.node.n2.waitlist", "w", ts, sig, body); return e },
	} {
		if err := check(); !errors.Is(err, signing.ErrBadSignature) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, _, err := v.VerifyMessage("s", "n1", "", "", body); !errors.Is(err, signing.ErrUnsigned) {
		t.Errorf("unsigned: %v", err)
	}
	if _, _, err := v.VerifyMessage("s", "x", ts, sig, body); !errors.Is(err, signing.ErrUnknownSender) {
		t.Errorf("unknown: %v", err)
	}
}

func TestReplayGuard(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	g := signing.NewReplayGuard(time.Minute, 3)
	now := time.Now()
	sealed := func(created time.Time) []byte {
		p := request("n")
		p.CreatedAt = timestamppb.New(created)
		b, err := k.signer.Seal(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a := decode(t, sealed(now))
	if r := g.Check(a, now, 7); r != "" {
		t.Fatalf("first: %q", r)
	}
	if r := g.Check(a, now, 7); r != "" {
		t.Errorf("redelivery of the same stream message refused: %q", r)
	}
	if r := g.Check(a, now, 8); r != signing.ReasonReplayed {
		t.Errorf("same signature as another message: %q", r)
	}
	if r := g.Check(a, now, 0); r != signing.ReasonReplayed {
		t.Errorf("same signature on core NATS: %q", r)
	}
	// The malleated twin (r, n-s) verifies too; it is the same signing.
	twin := decode(t, sealed(now))
	twin.Signature = malleate(t, a.Signature)
	if r := g.Check(twin, now, 9); r != signing.ReasonReplayed {
		t.Errorf("malleated signature: %q", r)
	}
	old := decode(t, sealed(now.Add(-2*time.Minute)))
	if r := g.Check(old, now, 10); r != signing.ReasonStale {
		t.Errorf("old packet: %q", r)
	}
	// Stored in the stream two minutes ago: a redelivery after an outage.
	if r := g.Check(old, now.Add(-2*time.Minute), 10); r != "" {
		t.Errorf("old packet, stored when created: %q", r)
	}
	if r := g.Check(decode(t, sealed(now.Add(2*time.Minute))), now, 11); r != signing.ReasonStale {
		t.Errorf("future packet: %q", r)
	}
	noTime := decode(t, sealed(now))
	noTime.CreatedAt = nil
	if r := g.Check(noTime, now, 12); r != signing.ReasonStale {
		t.Errorf("no created_at: %q", r)
	}
	// Bounded: beyond 3 signatures the oldest is forgotten and counted.
	for i := range 5 {
		if r := g.Check(decode(t, sealed(now)), now, uint64(100+i)); r != "" {
			t.Fatalf("fresh %d: %q", i, r)
		}
	}
	if g.Len() > 3 || g.Forgotten() == 0 {
		t.Errorf("seen-set %d entries, %d forgotten", g.Len(), g.Forgotten())
	}
}

func malleate(t *testing.T, sig []byte) []byte {
	t.Helper()
	b, err := signing.Malleate(sig)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
