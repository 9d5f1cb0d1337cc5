package signing_test

import (
	"testing"

	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/signing"
)

// The packets are a typical submit (two maps of several entries).

func BenchmarkSeal(b *testing.B) {
	k := newKey(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.signer.Seal(request("node-a")); err != nil {
			b.Fatal(err)
		}
	}
}

// benchVerify measures verify on one decoded packet (decoding is not
// included); with keys > 1 the signing key is listed last (worst case).
func benchVerify(b *testing.B, keys int, verify func(v *signing.Verifier, pkt *capv1.BusPacket, raw []byte) error) {
	k := newKey(b)
	var pubs []string
	for i := 1; i < keys; i++ {
		pubs = append(pubs, newKey(b).pub)
	}
	v := verifierFor(b, map[string][]string{"node-a": append(pubs, k.pub)})
	raw, err := k.signer.Seal(request("node-a"))
	if err != nil {
		b.Fatal(err)
	}
	pkt := decode(b, raw)
	b.ReportAllocs()
	for b.Loop() {
		if err := verify(v, pkt, raw); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyRaw is the node's path.
func BenchmarkVerifyRaw(b *testing.B) {
	benchVerify(b, 1, func(v *signing.Verifier, p *capv1.BusPacket, raw []byte) error { return v.VerifyRaw(p, raw) })
}

// BenchmarkVerify re-marshals the packet.
func BenchmarkVerify(b *testing.B) {
	benchVerify(b, 1, func(v *signing.Verifier, p *capv1.BusPacket, _ []byte) error { return v.Verify(p) })
}

// BenchmarkVerifyRawSecondKey: two keys listed (a rotation), signed by the second.
func BenchmarkVerifyRawSecondKey(b *testing.B) {
	benchVerify(b, 2, func(v *signing.Verifier, p *capv1.BusPacket, raw []byte) error { return v.VerifyRaw(p, raw) })
}

// BenchmarkRejectUnsigned is what an unsigned packet costs.
func BenchmarkRejectUnsigned(b *testing.B) {
	v := verifierFor(b, map[string][]string{"node-a": {newKey(b).pub}})
	pkt := request("node-a")
	b.ReportAllocs()
	for b.Loop() {
		if v.Verify(pkt) == nil {
			b.Fatal("verified")
		}
	}
}
