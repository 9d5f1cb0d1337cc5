package bus_test

import (
	"errors"
	"testing"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/signing"
)

func signer(t *testing.T) (*signing.Signer, string) {
	t.Helper()
	priv, pub, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := signing.ParseSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, string(pub)
}

// verifyAs decodes data and verifies it against a key set where sender has
// exactly the key pub.
func verifyAs(t *testing.T, data []byte, sender, pub string) error {
	t.Helper()
	ks, err := signing.ParseKeySet([]byte(sender + ": |\n  " + indentPEM(pub)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := bus.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	return signing.NewVerifier(ks).VerifyRaw(p, data)
}

func indentPEM(s string) string {
	out := []byte{}
	for i := 0; i < len(s); i++ {
		out = append(out, s[i])
		if s[i] == '\n' && i+1 < len(s) {
			out = append(out, ' ', ' ')
		}
	}
	return string(out)
}

// SignAs signs the Encode* helpers' packets of one sender id (and no
// other), the latest registration wins, and release restores the previous.
// The sender ids are unique to this test: registrations are process-wide.
func TestSignAsSignsOneSenderUntilReleased(t *testing.T) {
	first, firstPub := signer(t)
	second, secondPub := signer(t)
	res := &capv1.JobResult{JobId: "j1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}
	const me, other = "bus-test-signer", "bus-test-other"

	enc := func(sender string) []byte {
		data, err := bus.EncodeResult("t", sender, res)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	if err := verifyAs(t, enc(me), me, firstPub); !errors.Is(err, signing.ErrUnsigned) {
		t.Fatalf("before SignAs: %v", err)
	}
	releaseFirst := bus.SignAs(me, first)
	if err := verifyAs(t, enc(me), me, firstPub); err != nil {
		t.Fatalf("after SignAs: %v", err)
	}
	if err := verifyAs(t, enc(other), other, firstPub); !errors.Is(err, signing.ErrUnsigned) {
		t.Fatalf("another sender was signed: %v", err)
	}
	releaseSecond := bus.SignAs(me, second)
	if err := verifyAs(t, enc(me), me, secondPub); err != nil {
		t.Fatalf("latest registration: %v", err)
	}
	releaseSecond()
	releaseSecond() // idempotent
	if err := verifyAs(t, enc(me), me, firstPub); err != nil {
		t.Fatalf("after releasing the latest: %v", err)
	}
	releaseFirst()
	if err := verifyAs(t, enc(me), me, firstPub); !errors.Is(err, signing.ErrUnsigned) {
		t.Fatalf("after releasing all: %v", err)
	}
	// An explicit Encoder signer signs whatever the sender.
	data, err := bus.Encoder{Signer: second}.Heartbeat(other, &capv1.Heartbeat{WorkerId: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyAs(t, data, other, secondPub); err != nil {
		t.Fatalf("Encoder.Signer: %v", err)
	}
}
