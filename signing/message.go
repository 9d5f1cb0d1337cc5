package signing

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"time"
)

// Node-to-node messages that are not CAP packets (capacity gossip, the
// queue questions, forwarded events) are signed in NATS headers: the
// signature covers a domain tag, the subject, the signing time and the body,
// so a signature taken from one subject or time does not verify on another.

// Header names of a signed node-to-node message.
const (
	headerSender   = "Troupe-Sender"
	headerSignedAt = "Troupe-Signed-At" // Unix nanoseconds
	headerSig      = "Troupe-Signature" // base64 (standard) of an ASN.1 DER ECDSA signature
)

const messageDomain = "troupe-msg/1\n"

func messageDigest(subject string, at int64, data []byte) []byte {
	h := sha256.New()
	h.Write([]byte(messageDomain))
	h.Write([]byte(subject))
	h.Write([]byte{'\n'})
	h.Write(strconv.AppendInt(nil, at, 10))
	h.Write([]byte{'\n'})
	h.Write(data)
	return h.Sum(nil)
}

// SignMessage signs a node-to-node message body for subject at time at; it
// returns the header values for headerSignedAt and headerSig.
func (s *Signer) SignMessage(subject string, at time.Time, data []byte) (signedAt, sig string, err error) {
	ns := at.UnixNano()
	b, err := ecdsa.SignASN1(rand.Reader, s.key, messageDigest(subject, ns, data))
	if err != nil {
		return "", "", err
	}
	return strconv.FormatInt(ns, 10), base64.StdEncoding.EncodeToString(b), nil
}

// VerifyMessage checks a node-to-node message's header signature and
// returns its principal and signing time. The caller checks the role and
// the time.
func (v *Verifier) VerifyMessage(subject, sender, signedAt, sig string, data []byte) (Principal, time.Time, error) {
	if sig == "" {
		return Principal{}, time.Time{}, &VerifyError{Reason: ReasonUnsigned, Sender: sender}
	}
	e := v.keys.Load().lookup(sender)
	if e == nil || len(e.keys) == 0 {
		return Principal{}, time.Time{}, &VerifyError{Reason: ReasonUnknownSender, Sender: sender}
	}
	ns, err := strconv.ParseInt(signedAt, 10, 64)
	raw, err2 := base64.StdEncoding.DecodeString(sig)
	if err != nil || err2 != nil || len(raw) > maxSignatureBytes ||
		!anyVerifies(e.keys, messageDigest(subject, ns, data), raw) {
		return Principal{}, time.Time{}, &VerifyError{Reason: ReasonBadSignature, Sender: sender}
	}
	p := e.p
	p.Sender = sender
	return p, time.Unix(0, ns), nil
}
