package signing_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/signing"
)

// keyPair is a generated key: its signer and its public PEM.
type keyPair struct {
	signer *signing.Signer
	pub    string
	priv   []byte
}

func newKey(t testing.TB) keyPair {
	t.Helper()
	priv, pub, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := signing.ParseSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	return keyPair{signer: s, pub: string(pub), priv: priv}
}

// keySetYAML lists each sender with its keys as a YAML flow sequence.
func keySetYAML(entries map[string][]string) []byte {
	var b strings.Builder
	for sender, pubs := range entries {
		b.WriteString(quote(sender) + ": [")
		for i, p := range pubs {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(quote(p))
		}
		b.WriteString("]\n")
	}
	return []byte(b.String())
}

func quote(s string) string {
	return `"` + strings.ReplaceAll(s, "\n", `\n`) + `"`
}

func verifierFor(t testing.TB, entries map[string][]string) *signing.Verifier {
	t.Helper()
	ks, err := signing.ParseKeySet(keySetYAML(entries))
	if err != nil {
		t.Fatal(err)
	}
	return signing.NewVerifier(ks)
}

// request is a packet with maps of several entries, so an encoding that is
// not deterministic would differ from run to run.
func request(sender string) *capv1.BusPacket {
	return &capv1.BusPacket{TraceId: "trace-1", SenderId: sender, CreatedAt: timestamppb.New(time.Unix(1700000000, 0)),
		ProtocolVersion: 1, Payload: &capv1.BusPacket_JobRequest{JobRequest: &capv1.JobRequest{
			JobId: "job-1", Topic: "job.echo", ContextPtr: "redis://ctx:job-1",
			Labels: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5"},
			Env:    map[string]string{"x": "1", "y": "2", "z": "3"},
		}}}
}

func decode(t testing.TB, b []byte) *capv1.BusPacket {
	t.Helper()
	p := &capv1.BusPacket{}
	if err := proto.Unmarshal(b, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSealedPacketVerifiesBothWays(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	v := verifierFor(t, map[string][]string{"node-a": {k.pub}})
	raw, err := k.signer.Seal(request("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	pkt := decode(t, raw)
	if len(pkt.Signature) == 0 {
		t.Fatal("sealed packet carries no signature")
	}
	if err := v.VerifyRaw(pkt, raw); err != nil {
		t.Fatalf("VerifyRaw: %v", err)
	}
	if err := v.Verify(pkt); err != nil {
		t.Fatalf("Verify (re-marshal): %v", err)
	}
	// Seal's output is what a deterministic marshal of the signed packet is.
	again, _ := proto.MarshalOptions{Deterministic: true}.Marshal(pkt)
	if !bytes.Equal(raw, again) {
		t.Fatal("sealed bytes differ from the deterministic encoding of the signed packet")
	}
}

// A sender that signs the deterministic encoding but sends its packet with
// plain proto.Marshal (map order random) still verifies: VerifyRaw falls
// back to re-marshalling.
func TestSignThenPlainMarshalVerifies(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	v := verifierFor(t, map[string][]string{"client": {k.pub}})
	for i := 0; i < 20; i++ {
		pkt := request("client")
		if err := k.signer.Sign(pkt); err != nil {
			t.Fatal(err)
		}
		raw, err := proto.Marshal(pkt)
		if err != nil {
			t.Fatal(err)
		}
		if err := v.VerifyRaw(decode(t, raw), raw); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
}

func TestVerifyReasons(t *testing.T) {
	t.Parallel()
	k, other := newKey(t), newKey(t)
	v := verifierFor(t, map[string][]string{"node-a": {k.pub}, "node-b": {other.pub}})
	seal := func(s *signing.Signer, p *capv1.BusPacket) []byte {
		raw, err := s.Seal(p)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	unsigned, _ := proto.Marshal(request("node-a"))
	byStranger := seal(k.signer, request("stranger"))
	wrongKey := seal(other.signer, request("node-a")) // node-b's key claiming to be node-a
	tamperedPkt := decode(t, seal(k.signer, request("node-a")))
	tamperedPkt.GetJobRequest().Topic = "job.evil"
	tampered, _ := proto.Marshal(tamperedPkt)
	relabelled := decode(t, seal(k.signer, request("node-a")))
	relabelled.GetJobRequest().Labels["a"] = "changed"
	resent, _ := proto.MarshalOptions{Deterministic: true}.Marshal(relabelled)
	garbageSig := decode(t, seal(k.signer, request("node-a")))
	garbageSig.Signature = []byte{0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x01}
	garbage, _ := proto.Marshal(garbageSig)

	for _, tc := range []struct {
		name string
		raw  []byte
		want error
	}{
		{"unsigned", unsigned, signing.ErrUnsigned},
		{"unknown sender", byStranger, signing.ErrUnknownSender},
		{"another sender's key", wrongKey, signing.ErrBadSignature},
		{"tampered topic", tampered, signing.ErrBadSignature},
		{"tampered map entry", resent, signing.ErrBadSignature},
		{"garbage signature", garbage, signing.ErrBadSignature},
	} {
		pkt := decode(t, tc.raw)
		for name, err := range map[string]error{"VerifyRaw": v.VerifyRaw(pkt, tc.raw), "Verify": v.Verify(pkt)} {
			if !errors.Is(err, tc.want) {
				t.Errorf("%s: %s: got %v, want %v", tc.name, name, err, tc.want)
			}
			if signing.ReasonOf(err) != signing.ReasonOf(tc.want) {
				t.Errorf("%s: %s: reason %q", tc.name, name, signing.ReasonOf(err))
			}
		}
	}
}

func TestRotationAcceptsEveryListedKey(t *testing.T) {
	t.Parallel()
	old, cur := newKey(t), newKey(t)
	both := verifierFor(t, map[string][]string{"w1": {cur.pub, old.pub}})
	newOnly := verifierFor(t, map[string][]string{"w1": {cur.pub}})
	for _, k := range []keyPair{old, cur} {
		raw, _ := k.signer.Seal(request("w1"))
		if err := both.VerifyRaw(decode(t, raw), raw); err != nil {
			t.Fatalf("during rotation: %v", err)
		}
	}
	raw, _ := old.signer.Seal(request("w1"))
	if err := newOnly.VerifyRaw(decode(t, raw), raw); !errors.Is(err, signing.ErrBadSignature) {
		t.Fatalf("a retired key still verifies: %v", err)
	}
}

func TestSenderPatterns(t *testing.T) {
	t.Parallel()
	exact, saga, any := newKey(t), newKey(t), newKey(t)
	v := verifierFor(t, map[string][]string{
		"troupe-saga/node-a": {exact.pub},
		"troupe-saga/*":      {saga.pub},
		"*":                  {any.pub},
	})
	for _, tc := range []struct {
		sender string
		key    keyPair
		ok     bool
	}{
		{"troupe-saga/node-a", exact, true},
		{"troupe-saga/node-a", saga, false}, // the exact entry wins; its keys only
		{"troupe-saga/node-b", saga, true},
		{"troupe-saga/node-b", any, false}, // the longest pattern wins
		{"somebody", any, true},
	} {
		raw, _ := tc.key.signer.Seal(request(tc.sender))
		err := v.VerifyRaw(decode(t, raw), raw)
		if (err == nil) != tc.ok {
			t.Errorf("sender %s: err %v, want ok=%v", tc.sender, err, tc.ok)
		}
	}
}

// withUnknown appends fields a newer CAP version might carry: field 17 on
// the envelope and field 99 inside the JobRequest (both unknown to us).
func withUnknown(t *testing.T, value string) []byte {
	t.Helper()
	req, _ := proto.MarshalOptions{Deterministic: true}.Marshal(request("new").GetJobRequest())
	req = protowire.AppendTag(req, 99, protowire.BytesType)
	req = protowire.AppendString(req, value)
	pkt := request("new")
	pkt.Payload = nil
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(pkt)
	b = protowire.AppendTag(b, 10, protowire.BytesType)
	b = protowire.AppendBytes(b, req)
	b = protowire.AppendTag(b, 17, protowire.VarintType)
	return protowire.AppendVarint(b, 7)
}

// Unknown fields are kept and signed: a packet from a newer sender verifies
// both ways, and changing an unknown field breaks its signature.
func TestUnknownFieldsAreCoveredBySignature(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	v := verifierFor(t, map[string][]string{"new": {k.pub}})
	pkt := decode(t, withUnknown(t, "original"))
	if len(pkt.ProtoReflect().GetUnknown()) == 0 || len(pkt.GetJobRequest().ProtoReflect().GetUnknown()) == 0 {
		t.Fatal("test packet lost its unknown fields on decode")
	}
	raw, err := k.signer.Seal(pkt)
	if err != nil {
		t.Fatal(err)
	}
	got := decode(t, raw)
	if err := v.VerifyRaw(got, raw); err != nil {
		t.Fatalf("VerifyRaw: %v", err)
	}
	if err := v.Verify(got); err != nil {
		t.Fatalf("Verify: %v", err)
	}

	// The same packet with the unknown field's value changed and the
	// original signature kept.
	forged := decode(t, withUnknown(t, "0riginal"))
	forged.Signature = got.Signature
	fraw, _ := proto.MarshalOptions{Deterministic: true}.Marshal(forged)
	forged = decode(t, fraw)
	if err := v.VerifyRaw(forged, fraw); !errors.Is(err, signing.ErrBadSignature) {
		t.Fatalf("tampered unknown field: VerifyRaw %v", err)
	}
	if err := v.Verify(forged); !errors.Is(err, signing.ErrBadSignature) {
		t.Fatalf("tampered unknown field: Verify %v", err)
	}
}

// A foreign signer that hashed its own field order (an unknown field 9
// before the payload) verifies from the raw bytes only: re-marshalling moves
// the unknown field to the end. This is why the node verifies with VerifyRaw.
func TestForeignFieldOrderVerifiesFromRawBytesOnly(t *testing.T) {
	t.Parallel()
	k := newKey(t)
	v := verifierFor(t, map[string][]string{"foreign": {k.pub}})
	pkt := request("foreign")
	req, _ := proto.MarshalOptions{Deterministic: true}.Marshal(pkt.GetJobRequest())
	pkt.Payload = nil
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(pkt)
	b = protowire.AppendTag(b, 9, protowire.VarintType) // unknown, before field 10
	b = protowire.AppendVarint(b, 1)
	b = protowire.AppendTag(b, 10, protowire.BytesType)
	b = protowire.AppendBytes(b, req)
	moved, _ := proto.MarshalOptions{Deterministic: true}.Marshal(decode(t, b))
	if bytes.Equal(moved, b) {
		t.Fatal("re-marshal kept the foreign field order; the test proves nothing")
	}
	sigOverRaw := signRaw(t, k, b)
	wire := append(append([]byte{}, b...), protowire.AppendBytes(protowire.AppendTag(nil, 14, protowire.BytesType), sigOverRaw)...)
	got := decode(t, wire)
	if err := v.VerifyRaw(got, wire); err != nil {
		t.Fatalf("VerifyRaw: %v", err)
	}
	if err := v.Verify(got); !errors.Is(err, signing.ErrBadSignature) {
		t.Fatalf("Verify (re-marshal only) unexpectedly: %v", err)
	}
}

// signRaw signs SHA-256 of exactly b, as a signer with another encoder would.
func signRaw(t *testing.T, k keyPair, b []byte) []byte {
	t.Helper()
	sig, err := signing.SignBytesForTest(k.signer, b)
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

func TestLoadSignerFormats(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k := newKey(t)
	pkcs8 := filepath.Join(dir, "pkcs8.pem")
	write(t, pkcs8, k.priv)
	if _, err := signing.LoadSigner(pkcs8); err != nil {
		t.Fatalf("PKCS8: %v", err)
	}
	sec1 := filepath.Join(dir, "sec1.pem")
	write(t, sec1, []byte(sec1PEM(t)))
	s, err := signing.LoadSigner(sec1)
	if err != nil {
		t.Fatalf("SEC1 with EC PARAMETERS: %v", err)
	}
	if !bytes.Contains(s.PublicPEM(), []byte("BEGIN PUBLIC KEY")) {
		t.Fatal("no public PEM")
	}
	for name, content := range map[string]string{
		"empty":      "",
		"public":     k.pub,
		"p384":       p384PEM(t),
		"encrypted":  "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
		"broken":     "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
		"not pem":    "hello",
		"rsa header": "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n",
	} {
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		write(t, p, []byte(content))
		_, err := signing.LoadSigner(p)
		if err == nil {
			t.Errorf("%s: loaded", name)
			continue
		}
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error does not name the file: %v", name, err)
		}
		if strings.Contains(err.Error(), "MII") || strings.Contains(err.Error(), "AAAA") {
			t.Errorf("%s: error repeats key material: %v", name, err)
		}
	}
	if _, err := signing.LoadSigner(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file loaded")
	}
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// sec1PEM is a P-256 key as `openssl ecparam -name prime256v1 -genkey`
// writes it: an EC PARAMETERS block, then the SEC 1 key.
func sec1PEM(t *testing.T) string {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n" +
		string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))
}

// p384PEM is a P-384 key (PKCS8), which a Signer refuses.
func p384PEM(t *testing.T) string {
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
}

func TestVerifierReloadKeepsTheOldSetOnError(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "keys.yaml")
	a, b := newKey(t), newKey(t)
	write(t, path, keySetYAML(map[string][]string{"w": {a.pub}}))
	v, err := signing.LoadVerifier(path)
	if err != nil {
		t.Fatal(err)
	}
	rawB, _ := b.signer.Seal(request("w"))
	if err := v.VerifyRaw(decode(t, rawB), rawB); err == nil {
		t.Fatal("b verifies before it is listed")
	}
	write(t, path, keySetYAML(map[string][]string{"w": {b.pub}}))
	if err := v.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := v.VerifyRaw(decode(t, rawB), rawB); err != nil {
		t.Fatalf("after reload: %v", err)
	}
	write(t, path, []byte("w: [not a key]\n"))
	if err := v.Reload(); !errors.Is(err, signing.ErrInvalidKeySet) {
		t.Fatalf("bad file reloaded: %v", err)
	}
	if err := v.VerifyRaw(decode(t, rawB), rawB); err != nil {
		t.Fatalf("a refused reload dropped the set in use: %v", err)
	}
}
