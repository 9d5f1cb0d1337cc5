package signing_test

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/signing"
)

func indent(pemText string) string { return indentN(pemText, "  ") }

func indentN(pemText, pad string) string {
	return pad + strings.ReplaceAll(strings.TrimSpace(pemText), "\n", "\n"+pad) + "\n"
}

func TestKeySetBlockAndListForms(t *testing.T) {
	t.Parallel()
	a, b, c := newKey(t), newKey(t), newKey(t)
	file := "# the nodes\nnode-a: |\n" + indent(a.pub) +
		"node-b:\n  - |\n" + indentN(b.pub, "    ") + "  - " + quote(c.pub) + "\n" +
		"both-in-one: |\n" + indent(a.pub+b.pub)
	ks, err := signing.ParseKeySet([]byte(file))
	if err != nil {
		t.Fatalf("%v\n%s", err, file)
	}
	for sender, n := range map[string]int{"node-a": 1, "node-b": 2, "both-in-one": 2, "nobody": 0} {
		if got := len(ks.Keys(sender)); got != n {
			t.Errorf("%s: %d keys, want %d", sender, got, n)
		}
	}
	if ks.Senders() != 3 {
		t.Errorf("senders %d", ks.Senders())
	}
}

func TestKeySetErrorsNameLineAndSender(t *testing.T) {
	t.Parallel()
	good := newKey(t)
	edPub, _, _ := ed25519.GenerateKey(nil)
	edDER, _ := x509.MarshalPKIXPublicKey(edPub)
	ed := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: edDER}))
	many := make([]string, signing.MaxKeysPerSender+1)
	for i := range many {
		many[i] = good.pub
	}
	for _, tc := range []struct {
		name, file string
		line       int
		sender     string
		contains   string
	}{
		{"empty", "", 1, "", "no senders"},
		{"list at top", "- a\n- b\n", 1, "", "mapping"},
		{"syntax", "a: [\n", 0, "", ""},
		{"not pem", "ok: " + quote(good.pub) + "\nbad: hello\n", 2, "bad", "not a PEM public key"},
		{"private key", "w:\n  - " + quote(good.pub) + "\n  - " + quote(string(good.priv)) + "\n", 3, "w", "key 2"},
		{"ed25519", "w: " + quote(ed) + "\n", 1, "w", "not an ECDSA P-256"},
		{"broken der", "w: \"-----BEGIN PUBLIC KEY-----\\nAAAA\\n-----END PUBLIC KEY-----\\n\"\n", 1, "w", "does not parse"},
		{"duplicate", "w: " + quote(good.pub) + "\nx: " + quote(good.pub) + "\nw: " + quote(good.pub) + "\n", 3, "w", "first at line 1"},
		{"star inside", "a*b: " + quote(good.pub) + "\n", 1, "a*b", "only allowed at the end"},
		{"space", "\"a b\": " + quote(good.pub) + "\n", 1, "a b", "space"},
		{"mapping value", "w: {k: v}\n", 1, "w", `unknown key "k"`},
		{"empty list", "w: []\n", 1, "w", "no keys"},
		{"too many", string(keySetYAML(map[string][]string{"w": many})), 1, "w", fmt.Sprintf("more than %d", signing.MaxKeysPerSender)},
	} {
		_, err := signing.ParseKeySet([]byte(tc.file))
		var kse *signing.KeySetError
		if !errors.As(err, &kse) || !errors.Is(err, signing.ErrInvalidKeySet) {
			t.Errorf("%s: error %v is not a KeySetError", tc.name, err)
			continue
		}
		if tc.line > 0 && kse.Line != tc.line {
			t.Errorf("%s: line %d, want %d (%v)", tc.name, kse.Line, tc.line, err)
		}
		if kse.Sender != tc.sender {
			t.Errorf("%s: sender %q, want %q (%v)", tc.name, kse.Sender, tc.sender, err)
		}
		if !strings.Contains(err.Error(), tc.contains) {
			t.Errorf("%s: %q does not say %q", tc.name, err, tc.contains)
		}
	}
}

// FuzzVerify: whatever the bytes and the signature, Verify and VerifyRaw
// never panic, and every error they return carries a reason.
func FuzzVerify(f *testing.F) {
	k := newKey(f)
	v := verifierFor(f, map[string][]string{"node-a": {k.pub}, "*": {k.pub}})
	raw, err := k.signer.Seal(request("node-a"))
	if err != nil {
		f.Fatal(err)
	}
	pkt := decode(f, raw)
	f.Add(raw, pkt.Signature)
	f.Add(raw, []byte{})
	f.Add([]byte{}, []byte{0x30, 0x00})
	f.Add([]byte{0x72, 0x02, 0x30, 0x00}, []byte{0x30, 0x44, 0x02, 0x20})
	f.Add(raw[:len(raw)/2], make([]byte, 72))
	f.Add(raw, append(append([]byte{}, pkt.Signature...), 0))
	f.Fuzz(func(t *testing.T, data, sig []byte) {
		p := &capv1.BusPacket{}
		if proto.Unmarshal(data, p) != nil {
			p.Reset()
		}
		p.Signature = sig
		for _, err := range []error{v.VerifyRaw(p, data), v.Verify(p)} {
			if err != nil && signing.ReasonOf(err) == "" {
				t.Fatalf("error without a reason: %v", err)
			}
		}
	})
}
