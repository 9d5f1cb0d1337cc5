package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// A multi-job call (evalShaMulti, lua/lib/multi.lua) passes its jobs'
// arguments as one MessagePack value, ARGV[1], which the script decodes
// with Redis's cmsgpack.unpack: an array with one element per job, itself
// an array of the job's number of keys and then its arguments, each a
// string as a call of its own would have it in ARGV (a number as its
// decimal text, go-redis's writing). Go-redis wrote each argument with a
// length prefix and CRLFs, through a type switch: ~45 arguments for a
// job's activation and ~25 for its transition were ~5 % of the node's CPU
// (issue #33). Encoding them here is a few appends each, into a buffer
// kept for the next flush; Redis decodes them in C, as it parses a
// command's arguments. The keys stay arguments of their own (KEYS): a
// Redis Cluster routes and checks them.

// appendPackedHeader appends a MessagePack array header of n elements.
func appendPackedHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
	}
}

// appendPackedString appends s as a MessagePack string (any bytes: Redis's
// cmsgpack makes a Lua string of them as they are).
func appendPackedString[T string | []byte](b []byte, s T) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n < 1<<8:
		b = append(b, 0xd9, byte(n))
	case n < 1<<16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

// appendPackedInt appends v as its decimal text, a MessagePack string
// (at most 20 bytes: a one-byte header).
func appendPackedInt(b []byte, v int64) []byte {
	at := len(b)
	b = strconv.AppendInt(append(b, 0), v, 10)
	b[at] = 0xa0 | byte(len(b)-at-1)
	return b
}

// appendPackedJob appends one job's element of a multi-job call: an array
// of nkeys (a MessagePack integer) and args, each as appendArgs gives them
// (the types go-redis would write for the call's ARGV). An argument of
// another type is an error: nothing is sent.
func appendPackedJob(b []byte, nkeys int, args []interface{}) ([]byte, error) {
	b = appendPackedHeader(b, 1+len(args))
	if nkeys < 0 || nkeys >= 1<<16 {
		return b, fmt.Errorf("store: multi-job call: %d keys for one job", nkeys)
	}
	if nkeys < 128 {
		b = append(b, byte(nkeys))
	} else {
		b = binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(nkeys))
	}
	for _, a := range args {
		switch v := a.(type) {
		case *string:
			b = appendPackedString(b, *v)
		case string:
			b = appendPackedString(b, v)
		case []byte:
			b = appendPackedString(b, v)
		case *int64:
			b = appendPackedInt(b, *v)
		case int64:
			b = appendPackedInt(b, v)
		case int:
			b = appendPackedInt(b, int64(v))
		default:
			return b, fmt.Errorf("store: multi-job call: argument of type %T", a)
		}
	}
	return b, nil
}

// packedBufs recycles the packed-argument buffers of multi-job calls: one
// per call, up to multiMax jobs' arguments (their requests included), a
// few per flush. A buffer grown past packedBufMax is let go, so a burst of
// large requests does not keep its peak; at most packedBufsKept are kept.
var packedBufs struct {
	mu   sync.Mutex
	free [][]byte
}

const (
	packedBufCap   = 16 << 10
	packedBufMax   = 1 << 20
	packedBufsKept = 32
)

func getPackedBuf() []byte {
	packedBufs.mu.Lock()
	defer packedBufs.mu.Unlock()
	if k := len(packedBufs.free); k > 0 {
		b := packedBufs.free[k-1]
		packedBufs.free[k-1] = nil
		packedBufs.free = packedBufs.free[:k-1]
		return b
	}
	return make([]byte, 0, packedBufCap)
}

func putPackedBuf(b []byte) {
	if cap(b) > packedBufMax {
		return
	}
	packedBufs.mu.Lock()
	if len(packedBufs.free) < packedBufsKept {
		packedBufs.free = append(packedBufs.free, b[:0])
	}
	packedBufs.mu.Unlock()
}

// packedArgsProbe decodes a packed job as multi.lua does and returns its
// key count and arguments' lengths.
const packedArgsProbe = `local j = cmsgpack.unpack(ARGV[1])[1]
local out = {j[1]}
for i = 2, #j do out[#out + 1] = #j[i] end
return out`

// packedArgsDecode reports whether the server's scripts decode packed
// arguments (one job, strings of each header's length) as the Writer
// encodes them.
func packedArgsDecode(ctx context.Context, c redis.Scripter) bool {
	args := []interface{}{"", "0", "\x00\xff", string(make([]byte, 31)), string(make([]byte, 32)),
		string(make([]byte, 255)), string(make([]byte, 256)), string(make([]byte, 1<<16))}
	b, err := appendPackedJob(appendPackedHeader(nil, 1), 9, args)
	if err != nil {
		return false
	}
	got, err := c.Eval(ctx, packedArgsProbe, nil, b).Int64Slice()
	if err != nil || len(got) != 1+len(args) || got[0] != 9 {
		return false
	}
	for i, a := range args {
		if got[1+i] != int64(len(a.(string))) {
			return false
		}
	}
	return true
}
