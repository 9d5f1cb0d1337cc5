package main

import (
	"flag"
	"os"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/signing"
)

// signFlags are the packet signature flags (SECURITY.md, "Packet
// signatures"): --sign-key signs what a command sends, --verify-keys checks
// what it receives.
type signFlags struct {
	signKey, verifyKeys string
	sender              string // CLI commands' sender id
}

// registerCLI registers --sign-key and --sender for a command that
// publishes a packet of its own (submit, job cancel).
func (s *signFlags) registerCLI(fs *flag.FlagSet) {
	s.register(fs, true, false)
	fs.StringVar(&s.sender, "sender", envOr("TROUPE_SENDER", "troupe-cli"),
		"sender id of the packet (the key set entry that --sign-key's public key is listed under; env TROUPE_SENDER)")
}

// encoder returns the encoder for --sign-key (unsigned without it).
func (s *signFlags) encoder() (bus.Encoder, error) {
	signer, err := s.signer()
	if err != nil || signer == nil {
		return bus.Encoder{}, err
	}
	return bus.Encoder{Signer: signer}, nil
}

func (s *signFlags) register(fs *flag.FlagSet, sign, verify bool) {
	if sign {
		fs.StringVar(&s.signKey, "sign-key", os.Getenv("TROUPE_SIGN_KEY"),
			"sign every packet sent with this ECDSA P-256 private key (PEM, PKCS8 or SEC1; env TROUPE_SIGN_KEY)")
	}
	if verify {
		fs.StringVar(&s.verifyKeys, "verify-keys", os.Getenv("TROUPE_VERIFY_KEYS"),
			"verify the signature of every packet received against this key set (YAML: sender id → PEM public keys; env TROUPE_VERIFY_KEYS)")
	}
}

// signer loads --sign-key (nil without it).
func (s *signFlags) signer() (*signing.Signer, error) {
	if s.signKey == "" {
		return nil, nil
	}
	return signing.LoadSigner(s.signKey)
}

// verifier loads --verify-keys (nil without it).
func (s *signFlags) verifier() (*signing.Verifier, error) {
	if s.verifyKeys == "" {
		return nil, nil
	}
	return signing.LoadVerifier(s.verifyKeys)
}
