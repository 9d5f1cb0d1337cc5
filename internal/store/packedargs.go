package store

import (
	"context"
	"encoding/binary"
	"errors"
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

// packedArgs is one job's element of a multi-job call being written: the
// calls write their arguments here (packArgs) in their ARGV order, as
// appendArgs does for go-redis (TestPackedArgsDecodeToEachCallsOwnArgv
// holds the two to the same strings).
type packedArgs struct {
	b []byte
	n int // arguments written
}

func (p *packedArgs) str(s string)   { p.b = appendPackedString(p.b, s); p.n++ }
func (p *packedArgs) bytes(s []byte) { p.b = appendPackedString(p.b, s); p.n++ }
func (p *packedArgs) int(v int64)    { p.b = appendPackedInt(p.b, v); p.n++ }

// packer is a hot-path call that writes its arguments packed.
type packer interface {
	keyCount() int
	appendKeys(dst []interface{}) []interface{}
	packArgs(p *packedArgs)
}

// packJob appends c's element of a multi-job call to p.b: an array of its
// number of keys (a MessagePack integer) and its arguments. The array's
// header is written as a 16-bit count once the arguments are (a call has
// fewer than 65,536).
func (p *packedArgs) packJob(c packer) {
	at := len(p.b)
	p.b = append(p.b, 0xdc, 0, 0)
	nkeys := c.keyCount()
	if nkeys < 128 {
		p.b = append(p.b, byte(nkeys))
	} else {
		p.b = binary.BigEndian.AppendUint16(append(p.b, 0xcd), uint16(nkeys))
	}
	p.n = 0
	c.packArgs(p)
	binary.BigEndian.PutUint16(p.b[at+1:], uint16(1+p.n))
}

func (c *activateCall) packArgs(p *packedArgs) {
	p.str(c.node)
	p.int(c.nowMs)
	p.int(c.lockTTLMs)
	p.str(c.createArg())
	p.str(c.jobID)
	p.bytes(c.request)
	p.str(c.lockAfter)
	p.int(c.dueAt())
	p.str(c.parkedOwner)
	p.int(c.nowMs + 2*c.lockTTLMs)
	var create *activateCall
	if c.create {
		create = c
	}
	c.plan.packArgs(p, create)
}

func (c *transitionCall) packArgs(p *packedArgs) {
	p.str(c.lockValue)
	p.str(c.node)
	p.str(c.expected)
	p.int(c.nowMs)
	p.str(c.jobID)
	p.str(c.lockAfter)
	p.int(c.dueMs)
	p.str(c.plan.landedArg())
	c.plan.packArgs(p, nil)
}

// packArgs writes what appendArgs appends; create, when set, is the
// activation that creates the job, whose packed field (packCreate) is
// written straight into p.
func (pl planArgs) packArgs(p *packedArgs, create *activateCall) {
	t := pl.t
	if t == nil {
		p.int(0)
		p.int(0)
		p.int(0)
		if create != nil {
			p.str(fieldPacked)
			p.packCreate(create, nil)
		}
		return
	}
	p.int(int64(len(t.Path)))
	for i := range t.Path {
		p.str(string(t.Path[i].To))
		p.str(string(t.Path[i].Reason))
	}
	adds := pl.adds()
	p.int(int64(len(adds)))
	for i := range adds {
		a := &adds[i]
		p.int(a.Score)
		p.str(a.Member)
		p.int(a.TrimBelow)
		p.int(a.TTL.Milliseconds())
	}
	p.int(int64(len(t.Sets)))
	for i := range t.Sets {
		h := &t.Sets[i]
		p.str(h.Field)
		p.str(h.Value)
		p.int(h.TTL.Milliseconds())
	}
	if create == nil {
		for _, f := range t.Fields {
			p.str(f)
		}
	} else {
		for i := 0; i+1 < len(t.Fields); i += 2 {
			if !packable(t.Fields[i]) {
				p.str(t.Fields[i])
				p.str(t.Fields[i+1])
			}
		}
		p.str(fieldPacked)
		p.packCreate(create, t.Fields)
	}
	if t.Op != "" {
		p.str("op")
		p.str(t.Op)
	}
}

// packCreate writes packCreate's value for c, with fields (name, value
// pairs), as one string: a 32-bit length header, filled in once the
// value is written.
func (p *packedArgs) packCreate(c *activateCall, fields []string) {
	at := len(p.b)
	b := append(p.b, 0xdb, 0, 0, 0, 0)
	b = appendPackOne(b, "topic", c.topic)
	b = appendPackOne(b, "tenant", c.tenant)
	b = appendPackOne(b, "trace", c.traceID)
	for i := 0; i+1 < len(fields); i += 2 {
		if packable(fields[i]) {
			b = appendPackOne(b, fields[i], fields[i+1])
		}
	}
	binary.BigEndian.PutUint32(b[at+1:], uint32(len(b)-at-5))
	p.b = b
	p.n++
}

// appendPackOne is packOne on bytes.
func appendPackOne(b []byte, name, value string) []byte {
	b = append(b, name...)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(len(value)), 10)
	b = append(b, ':')
	return append(b, value...)
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
	lens := []int{0, 1, 31, 32, 255, 256, 1 << 16}
	p := packedArgs{b: append(appendPackedHeader(nil, 1), 0xdc, 0, byte(2+len(lens)), 9)}
	p.str("\x00\xff")
	for _, n := range lens {
		p.bytes(make([]byte, n))
	}
	got, err := c.Eval(ctx, packedArgsProbe, nil, p.b).Int64Slice()
	if err != nil || len(got) != 2+len(lens) || got[0] != 9 || got[1] != 2 {
		return false
	}
	for i, n := range lens {
		if got[2+i] != int64(n) {
			return false
		}
	}
	return true
}

// appendPackedReply appends to dst the elements of v, a script's reply (an
// array of strings) as cmsgpack.pack packs it: each element a part of v.
// A small non-negative integer element is its decimal text, as go-redis
// would read it; any other kind is an error.
func appendPackedReply(dst []string, v string) ([]string, error) {
	if v == "" {
		return nil, errors.New("store: packed reply: empty")
	}
	var n, i int
	switch c := v[0]; {
	case c >= 0x90 && c <= 0x9f:
		n, i = int(c&0x0f), 1
	case c == 0xdc:
		n, i = packedUint(v, 1, 2), 3
	case c == 0xdd:
		n, i = packedUint(v, 1, 4), 5
	default:
		return nil, fmt.Errorf("store: packed reply: not an array (%#x)", c)
	}
	for ; n > 0; n-- {
		if i >= len(v) {
			return nil, fmt.Errorf("store: packed reply: %d elements missing", n)
		}
		var l int
		switch c := v[i]; {
		case c <= 0x7f:
			dst = append(dst, strconv.Itoa(int(c)))
			i++
			continue
		case c >= 0xa0 && c <= 0xbf:
			l, i = int(c&0x1f), i+1
		case c == 0xd9 || c == 0xc4:
			l, i = packedUint(v, i+1, 1), i+2
		case c == 0xda || c == 0xc5:
			l, i = packedUint(v, i+1, 2), i+3
		case c == 0xdb || c == 0xc6:
			l, i = packedUint(v, i+1, 4), i+5
		default:
			return nil, fmt.Errorf("store: packed reply: element of kind %#x", c)
		}
		if l < 0 || i > len(v) || l > len(v)-i {
			return nil, errors.New("store: packed reply: truncated")
		}
		dst = append(dst, v[i:i+l])
		i += l
	}
	if i != len(v) {
		return nil, fmt.Errorf("store: packed reply: %d bytes after its elements", len(v)-i)
	}
	return dst, nil
}

// packedUint reads the width-byte big-endian number at v[i:] (-1 when v
// ends first).
func packedUint(v string, i, width int) int {
	if i+width > len(v) {
		return -1
	}
	n := 0
	for _, c := range []byte(v[i : i+width]) {
		n = n<<8 | int(c)
	}
	return n
}
