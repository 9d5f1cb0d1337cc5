// Package signing signs and verifies CAP packet signatures: BusPacket field
// 14, an ECDSA P-256 signature (ASN.1 DER) over SHA-256 of the marshalled
// BusPacket with the signature cleared (CAP-WIRE.md).
//
// # What exactly is signed
//
// A Signer marshals the packet deterministically
// (proto.MarshalOptions{Deterministic: true}, which sorts map entries), with
// the signature cleared, and signs SHA-256 of those bytes. It then marshals
// the signed packet the same way: the same bytes with field 14 added, so the
// packet on the wire minus field 14 is exactly what was signed.
//
// A Verifier has two candidates for the signed bytes and accepts either:
//
//  1. the bytes as received with every top-level field 14 cut out
//     (VerifyRaw only). This needs no re-encoding, keeps whatever the sender
//     encoded (unknown fields, map order) byte for byte, and is what every
//     Troupe-signed packet matches;
//  2. the decoded packet re-marshalled deterministically with the signature
//     cleared. This is what CAP describes, and it is the only candidate
//     Verify (without the raw bytes) has. It depends on the signer having
//     hashed the deterministic protobuf-go encoding: a sender that hashed
//     another encoding (map entries in another order, fields out of
//     number order) verifies through candidate 1 only if it also sent those
//     exact bytes.
//
// Both candidates decode to the packet the node acts on, so accepting either
// never lets a packet's meaning differ from what was signed.
//
// Unknown fields (a packet from a newer CAP version) are kept and covered by
// the signature: protobuf-go keeps them on decode and re-marshal writes them
// back verbatim at the end of their message, and candidate 1 never touches
// them. Changing an unknown field breaks the signature like any other field.
//
// # Roles and replays
//
// A signature proves which key holder produced a packet, not whether that
// holder may send it: the key set's roles and scopes say that
// (Principal, returned by VerifyPrincipal; the node checks it). Nor does
// it prove when: a captured packet verifies as is, and ReplayGuard bounds
// how long (created_at within a skew) and refuses a signature taken
// already within it. See SECURITY.md.
package signing

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Reason says why a packet failed verification. It is the "reason" label of
// troupe_packets_rejected_total.
type Reason string

// Verification failure reasons.
const (
	// ReasonUnsigned: the packet carries no signature.
	ReasonUnsigned Reason = "unsigned"
	// ReasonUnknownSender: the key set has no keys for the packet's sender_id.
	ReasonUnknownSender Reason = "unknown_sender"
	// ReasonBadSignature: no key of the sender verifies the signature (a
	// forged or tampered packet, or a key that was rotated out).
	ReasonBadSignature Reason = "bad_signature"
)

// VerifyError is a verification failure. Compare with errors.Is against
// ErrUnsigned, ErrUnknownSender and ErrBadSignature, or read Reason.
type VerifyError struct {
	Reason Reason
	// Sender is the packet's sender_id as it claims to be (untrusted input:
	// Error quotes and truncates it).
	Sender string
}

// Sentinels for errors.Is; a returned *VerifyError matches the one with its
// Reason.
var (
	ErrUnsigned      = &VerifyError{Reason: ReasonUnsigned}
	ErrUnknownSender = &VerifyError{Reason: ReasonUnknownSender}
	ErrBadSignature  = &VerifyError{Reason: ReasonBadSignature}
)

// maxSenderInError bounds how much of an untrusted sender_id an error
// message repeats.
const maxSenderInError = 128

// truncate bounds an untrusted sender id for messages.
func truncate(s string) string {
	if len(s) > maxSenderInError {
		s = s[:maxSenderInError]
		for !utf8.ValidString(s) && len(s) > 0 {
			s = s[:len(s)-1]
		}
		s += "…"
	}
	return s
}

func (e *VerifyError) Error() string {
	s := truncate(e.Sender)
	switch e.Reason {
	case ReasonUnsigned:
		return fmt.Sprintf("signing: packet from sender %q is not signed", s)
	case ReasonUnknownSender:
		return fmt.Sprintf("signing: no public key for sender %q", s)
	case ReasonBadSignature:
		return fmt.Sprintf("signing: signature of packet from sender %q does not verify", s)
	}
	return fmt.Sprintf("signing: packet from sender %q rejected: %s", s, e.Reason)
}

// Is matches the sentinel with the same Reason.
func (e *VerifyError) Is(target error) bool {
	t, ok := target.(*VerifyError)
	return ok && t.Sender == "" && t.Reason == e.Reason
}

// ReasonOf returns the Reason of a verification error ("" if err is not one).
func ReasonOf(err error) Reason {
	var ve *VerifyError
	if errors.As(err, &ve) {
		return ve.Reason
	}
	return ""
}
