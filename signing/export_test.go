package signing

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
)

// SignBytesForTest signs SHA-256 of b as it is: a stand-in for a CAP signer
// whose encoder orders fields differently from protobuf-go.
func SignBytesForTest(s *Signer, b []byte) ([]byte, error) {
	sum := sha256.Sum256(b)
	return ecdsa.SignASN1(rand.Reader, s.key, sum[:])
}
