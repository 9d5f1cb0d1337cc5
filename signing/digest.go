package signing

import (
	"crypto/sha256"
	"errors"
	"hash"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/proto/capv1"
)

// signatureField is BusPacket.signature's field number.
const signatureField protowire.Number = 14

// deterministic is the encoding both sides hash.
var deterministic = proto.MarshalOptions{Deterministic: true}

// digester holds what one digest computation needs, pooled so that
// verifying allocates no hash state or marshal buffer of its own.
type digester struct {
	h   hash.Hash
	buf []byte
	sum [sha256.Size]byte
}

// maxPooledBuf keeps one huge packet from pinning a huge buffer in the pool.
const maxPooledBuf = 64 << 10

var digesters = sync.Pool{New: func() any { return &digester{h: sha256.New()} }}

func getDigester() *digester { return digesters.Get().(*digester) }

func putDigester(d *digester) {
	if cap(d.buf) > maxPooledBuf {
		d.buf = nil
	}
	digesters.Put(d)
}

var errMalformed = errors.New("signing: malformed packet encoding")

// hashWithout sets d.sum to SHA-256 of b with every top-level field 14 left
// out, hashing the runs between them in place.
func (d *digester) hashWithout(b []byte) error {
	d.h.Reset()
	run := 0
	for i := 0; i < len(b); {
		num, typ, n := protowire.ConsumeTag(b[i:])
		if n < 0 {
			return errMalformed
		}
		m := protowire.ConsumeFieldValue(num, typ, b[i+n:])
		if m < 0 {
			return errMalformed
		}
		if num == signatureField {
			d.h.Write(b[run:i])
			run = i + n + m
		}
		i += n + m
	}
	d.h.Write(b[run:])
	d.h.Sum(d.sum[:0])
	return nil
}

// hashPacket sets d.sum to SHA-256 of pkt marshalled deterministically with
// its signature cleared. pkt is not modified: the signature is marshalled
// and then left out of the hash.
func (d *digester) hashPacket(pkt *capv1.BusPacket) error {
	var err error
	d.buf, err = deterministic.MarshalAppend(d.buf[:0], pkt)
	if err != nil {
		return err
	}
	return d.hashWithout(d.buf)
}
