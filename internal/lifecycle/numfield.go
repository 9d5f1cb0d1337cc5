package lifecycle

import (
	"strconv"
	"time"
	"unsafe"
)

// numArena holds the digits of a job's number fields (record fields,
// write op ids): one allocation for a job's several numbers where
// strconv.FormatInt made each a string of its own. Append-only: bytes
// once written are never written again, so the strings over them stay
// what they were for as long as anything holds them (they keep the arena
// alive, 128 bytes).
type numArena struct {
	n int
	b [120]byte
}

// maxDigits is the longest number formatInt and formatUint write: an
// int64 in base 10 with its sign (20); a uint64 in base 36 is 13.
const maxDigits = 20

// formatInt is strconv.FormatInt(v, 10), its digits in the job's arena.
func (j *Job) formatInt(v int64) string {
	if 0 <= v && v < 100 {
		return strconv.FormatInt(v, 10) // strconv's own constants
	}
	b := j.digits()
	s := strconv.AppendInt(b, v, 10)
	return j.took(s)
}

// formatUint is strconv.FormatUint(v, base), its digits in the job's
// arena.
func (j *Job) formatUint(v uint64, base int) string {
	b := j.digits()
	s := strconv.AppendUint(b, v, base)
	return j.took(s)
}

// formatMs is t's unix milliseconds, formatInt.
func (j *Job) formatMs(t time.Time) string { return j.formatInt(t.UnixMilli()) }

// digits returns an empty slice of the arena with room for maxDigits (a
// fresh arena when the job's has less).
func (j *Job) digits() []byte {
	a := j.nums
	if a == nil || len(a.b)-a.n < maxDigits {
		a = new(numArena)
		j.nums = a
	}
	return a.b[a.n:a.n:len(a.b)]
}

// took marks s, appended to digits' slice (within its room: never moved),
// as used and returns it as a string.
func (j *Job) took(s []byte) string {
	j.nums.n += len(s)
	return unsafe.String(unsafe.SliceData(s), len(s))
}
