package signing

import (
	"bytes"
	"crypto/ecdsa"
	"errors"
	"sync/atomic"

	"github.com/troupe-run/troupe/proto/capv1"
)

// maxSignatureBytes is the longest ASN.1 DER encoding of a P-256 ECDSA
// signature (two 33-byte INTEGERs in a SEQUENCE); anything longer is
// rejected without doing any cryptography.
const maxSignatureBytes = 72

// Verifier checks packet signatures against a key set. It is safe for
// concurrent use; Reload swaps the key set atomically.
type Verifier struct {
	path string                 // immutable; "" when built from a KeySet
	keys atomic.Pointer[KeySet] // replaced whole by Reload
}

// NewVerifier returns a Verifier over ks.
func NewVerifier(ks *KeySet) *Verifier {
	v := &Verifier{}
	v.keys.Store(ks)
	return v
}

// LoadVerifier reads the key set file at path; Reload re-reads it.
func LoadVerifier(path string) (*Verifier, error) {
	ks, err := LoadKeySet(path)
	if err != nil {
		return nil, err
	}
	v := &Verifier{path: path}
	v.keys.Store(ks)
	return v, nil
}

// Reload re-reads the key set file. An invalid file keeps the key set in
// use, and the error names the line.
func (v *Verifier) Reload() error {
	if v.path == "" {
		return errors.New("signing: verifier has no key set file to reload")
	}
	ks, err := LoadKeySet(v.path)
	if err != nil {
		return err
	}
	v.keys.Store(ks)
	return nil
}

// KeySet returns the key set in use.
func (v *Verifier) KeySet() *KeySet { return v.keys.Load() }

// Verify checks pkt's signature against the keys of its sender_id, hashing
// the packet re-marshalled deterministically with its signature cleared (see
// the package comment: this depends on the signer having hashed the same
// deterministic protobuf-go encoding). Prefer VerifyRaw when the received
// bytes are at hand. pkt is not modified. The error is a *VerifyError.
func (v *Verifier) Verify(pkt *capv1.BusPacket) error {
	_, err := v.verify(pkt, nil)
	return err
}

// VerifyRaw is Verify for a packet decoded from raw: it first hashes raw
// with its signature field cut out (no re-encoding, so any encoding the
// signer sent verifies), then falls back to the deterministic re-marshal.
func (v *Verifier) VerifyRaw(pkt *capv1.BusPacket, raw []byte) error {
	_, err := v.verify(pkt, raw)
	return err
}

// VerifyPrincipal is VerifyRaw returning who signed: the packet's sender
// with the role and scope its key set entry gives it. The caller decides
// whether that principal may send the packet (raw may be nil, as for
// Verify).
func (v *Verifier) VerifyPrincipal(pkt *capv1.BusPacket, raw []byte) (Principal, error) {
	return v.verify(pkt, raw)
}

func (v *Verifier) verify(pkt *capv1.BusPacket, raw []byte) (Principal, error) {
	sig := pkt.GetSignature()
	if len(sig) == 0 {
		return Principal{}, &VerifyError{Reason: ReasonUnsigned, Sender: pkt.GetSenderId()}
	}
	e := v.keys.Load().lookup(pkt.GetSenderId())
	if e == nil || len(e.keys) == 0 {
		return Principal{}, &VerifyError{Reason: ReasonUnknownSender, Sender: pkt.GetSenderId()}
	}
	keys := e.keys
	ok := e.p
	ok.Sender = pkt.GetSenderId()
	if len(sig) > maxSignatureBytes {
		return Principal{}, &VerifyError{Reason: ReasonBadSignature, Sender: pkt.GetSenderId()}
	}
	d := getDigester()
	defer putDigester(d)
	var tried [32]byte
	haveTried := false
	if raw != nil && d.hashWithout(raw) == nil {
		if anyVerifies(keys, d.sum[:], sig) {
			return ok, nil
		}
		tried, haveTried = d.sum, true
	}
	if d.hashPacket(pkt) == nil && !(haveTried && bytes.Equal(tried[:], d.sum[:])) {
		if anyVerifies(keys, d.sum[:], sig) {
			return ok, nil
		}
	}
	return Principal{}, &VerifyError{Reason: ReasonBadSignature, Sender: pkt.GetSenderId()}
}

func anyVerifies(keys []*ecdsa.PublicKey, digest, sig []byte) bool {
	for _, k := range keys {
		if ecdsa.VerifyASN1(k, digest, sig) {
			return true
		}
	}
	return false
}
