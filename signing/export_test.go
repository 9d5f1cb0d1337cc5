package signing

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/asn1"
	"math/big"
)

// SignBytesForTest signs SHA-256 of b as it is: a stand-in for a CAP signer
// whose encoder orders fields differently from protobuf-go.
func SignBytesForTest(s *Signer, b []byte) ([]byte, error) {
	sum := sha256.Sum256(b)
	return ecdsa.SignASN1(rand.Reader, s.key, sum[:])
}

// Malleate returns the other valid encoding (r, n−s) of an ASN.1 ECDSA
// P-256 signature.
func Malleate(sig []byte) ([]byte, error) {
	var rs struct{ R, S *big.Int }
	if _, err := asn1.Unmarshal(sig, &rs); err != nil {
		return nil, err
	}
	rs.S = new(big.Int).Sub(elliptic.P256().Params().N, rs.S)
	return asn1.Marshal(rs)
}

// Test names of unexported constants.
const MaxKeysPerSender = maxKeysPerSender
