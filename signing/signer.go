package signing

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/troupe-run/troupe/proto/capv1"
)

// maxKeyFileBytes bounds a key file read (a PEM P-256 key is a few hundred
// bytes; a key set with many senders a few hundred KiB).
const maxKeyFileBytes = 1 << 20

// Signer signs packets with one ECDSA P-256 private key. It is safe for
// concurrent use.
type Signer struct {
	key *ecdsa.PrivateKey // immutable
}

// NewSigner returns a Signer for key, which must be on P-256.
func NewSigner(key *ecdsa.PrivateKey) (*Signer, error) {
	if key == nil || key.Curve != elliptic.P256() {
		return nil, errors.New("signing: the private key must be ECDSA P-256")
	}
	return &Signer{key: key}, nil
}

// LoadSigner reads a PEM private key file: PKCS #8 ("PRIVATE KEY") or SEC 1
// ("EC PRIVATE KEY", as `openssl ecparam -genkey` writes it, with or
// without its "EC PARAMETERS" block). Errors name the file, never its content.
func LoadSigner(path string) (*Signer, error) {
	data, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	s, err := ParseSigner(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ParseSigner parses a PEM private key (see LoadSigner).
func ParseSigner(data []byte) (*Signer, error) {
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("signing: no PEM private key block (want PRIVATE KEY or EC PRIVATE KEY)")
		}
		if len(block.Headers) > 0 {
			return nil, errors.New("signing: encrypted PEM private keys are not supported")
		}
		var key any
		var err error
		switch block.Type {
		case "EC PARAMETERS":
			continue
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "ENCRYPTED PRIVATE KEY":
			return nil, errors.New("signing: encrypted PEM private keys are not supported")
		default:
			return nil, fmt.Errorf("signing: PEM block %q is not a private key (want PRIVATE KEY or EC PRIVATE KEY)", block.Type)
		}
		if err != nil {
			// The parser's message describes the structure, not the key.
			return nil, fmt.Errorf("signing: %s block does not parse: %w", block.Type, err)
		}
		ec, ok := key.(*ecdsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("signing: the private key is a %T, not ECDSA P-256", key)
		}
		return NewSigner(ec)
	}
}

func readKeyFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("signing: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("signing: %w", err)
	}
	if len(data) > maxKeyFileBytes {
		return nil, fmt.Errorf("signing: %s: larger than %d bytes", path, maxKeyFileBytes)
	}
	return data, nil
}

// Public returns the signer's public key.
func (s *Signer) Public() *ecdsa.PublicKey { return &s.key.PublicKey }

// PublicPEM returns the signer's public key as a PEM "PUBLIC KEY" block, the
// form a key set lists.
func (s *Signer) PublicPEM() []byte { return publicPEM(&s.key.PublicKey) }

func publicPEM(pub *ecdsa.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil { // only for unsupported curves, which NewSigner refuses
		panic(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// Sign sets pkt.Signature: ECDSA P-256 over SHA-256 of pkt marshalled
// deterministically with its signature cleared. Marshal the packet with
// Seal, or with proto.MarshalOptions{Deterministic: true}, or a verifier
// that only re-marshals (Verify) may hash different bytes.
func (s *Signer) Sign(pkt *capv1.BusPacket) error {
	_, err := s.seal(pkt, false)
	return err
}

// Seal signs pkt (setting pkt.Signature) and returns it marshalled
// deterministically: the signed bytes with field 14 added, so a verifier
// finds the signed bytes by cutting field 14 out. bus.Encode* call it for
// the senders a process signs as.
func (s *Signer) Seal(pkt *capv1.BusPacket) ([]byte, error) { return s.seal(pkt, true) }

func (s *Signer) seal(pkt *capv1.BusPacket, wire bool) ([]byte, error) {
	if pkt == nil {
		return nil, errors.New("signing: nil packet")
	}
	d := getDigester()
	defer putDigester(d)
	pkt.Signature = nil
	var err error
	d.buf, err = deterministic.MarshalAppend(d.buf[:0], pkt)
	if err != nil {
		return nil, fmt.Errorf("signing: marshal: %w", err)
	}
	if err := d.hashWithout(d.buf); err != nil {
		return nil, err
	}
	sig, err := ecdsa.SignASN1(rand.Reader, s.key, d.sum[:])
	if err != nil {
		return nil, fmt.Errorf("signing: sign: %w", err)
	}
	pkt.Signature = sig
	if !wire {
		return nil, nil
	}
	out, err := deterministic.Marshal(pkt)
	if err != nil {
		return nil, fmt.Errorf("signing: marshal: %w", err)
	}
	return out, nil
}

// GenerateKey returns a new P-256 key pair as PEM: the private key in PKCS #8
// and the public key as the key set lists it.
func GenerateKey() (privPEM, pubPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("signing: generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), publicPEM(&key.PublicKey), nil
}
