// Package jobdata keeps a job's input and result bytes in Redis where CAP
// expects them: the input under key ctx:<job_id>, pointed to by the
// request's context_ptr "redis://ctx:<job_id>", the result under
// res:<job_id>, pointed to by the result's result_ptr "redis://res:<job_id>".
// Keys carry no Troupe prefix, so a stock CAP worker that follows the
// convention reads the input and writes the result without knowing Troupe.
//
// The node's admin API, troupe.Client, the troupe CLI and worker.Typed use
// it; a value is at most Store.MaxBytes long and expires after Store.TTL.
package jobdata

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

// Defaults for Store fields left zero.
const (
	// MaxBytesDefault bounds one stored value: CAP keeps payloads off the
	// bus, not out of memory, and 1 MiB is much more than a job's
	// arguments usually are.
	MaxBytesDefault = 1 << 20
	// TTLDefault is how long a value is kept when the Store is not told
	// (twice the default job retention, see TTLFor).
	TTLDefault = 48 * time.Hour
)

// Key prefixes and the pointer scheme of CAP's Redis convention.
const (
	PointerScheme = "redis://"
	InputPrefix   = "ctx:"
	ResultPrefix  = "res:"
	// RedactedSuffix ends the key of a redacted copy of a result, which the
	// output policy stores beside the original.
	RedactedSuffix = ":redacted"
	// CompensationSuffix ends the key of a saga step's compensation input,
	// stored beside the step's own input.
	CompensationSuffix = ":comp"
)

// Content types a Datum reports.
const (
	TypeJSON   = "application/json"
	TypeText   = "text/plain"
	TypeBinary = "application/octet-stream"
)

// ErrTooLarge is returned for a value over the Store's MaxBytes.
var ErrTooLarge = errors.New("jobdata: payload too large")

// ErrNotHeld is returned for a pointer that is not a Redis pointer of this
// convention (another store's, or none): Troupe shows it, never reads it.
var ErrNotHeld = errors.New("jobdata: pointer not held in Redis by this convention")

// ErrMissing is returned when the pointer's key does not exist (never
// written, or expired).
var ErrMissing = errors.New("jobdata: no value behind the pointer")

// InputPointer is the context_ptr of jobID's input.
func InputPointer(jobID string) string { return PointerScheme + InputPrefix + jobID }

// ResultPointer is the result_ptr of jobID's result.
func ResultPointer(jobID string) string { return PointerScheme + ResultPrefix + jobID }

// CompensationPointer is the context_ptr of the compensation input a saga
// step jobID carries.
func CompensationPointer(jobID string) string { return InputPointer(jobID) + CompensationSuffix }

// TTLFor is the TTL of data kept for jobs whose records are kept retention
// after they end: twice that, counted from the write, so the input of a
// job that ends within one retention period outlives its record (retention
// ≤ 0, kept for ever: no TTL).
func TTLFor(retention time.Duration) time.Duration {
	if retention <= 0 {
		return 0
	}
	return 2 * retention
}

// Key returns the Redis key ptr names, if ptr is "redis://ctx:…" or
// "redis://res:…"; otherwise ErrNotHeld.
func Key(ptr string) (string, error) {
	key, ok := strings.CutPrefix(ptr, PointerScheme)
	if !ok || !(strings.HasPrefix(key, InputPrefix) || strings.HasPrefix(key, ResultPrefix)) ||
		len(key) == len(InputPrefix) {
		return "", fmt.Errorf("%w: %q", ErrNotHeld, ptr)
	}
	return key, nil
}

// OwnedBy reports whether ptr names data of job jobID: its input, its
// result, the redacted copy of its result, or its compensation input.
// Callers that check access by job use it so that a request cannot point
// at another job's data.
func OwnedBy(ptr, jobID string) bool {
	if jobID == "" {
		return false
	}
	switch ptr {
	case InputPointer(jobID), ResultPointer(jobID), ResultPointer(jobID) + RedactedSuffix,
		CompensationPointer(jobID):
		return true
	}
	return false
}

// Store reads and writes job data in Redis. The zero value of its limits
// takes the defaults; a nil Client is an error on use.
type Store struct {
	Client redis.UniversalClient
	// MaxBytes bounds a value written (default MaxBytesDefault).
	MaxBytes int64
	// TTL is a written value's expiry (0: TTLDefault; negative: none).
	TTL time.Duration
}

func (s *Store) maxBytes() int64 {
	if s.MaxBytes > 0 {
		return s.MaxBytes
	}
	return MaxBytesDefault
}

func (s *Store) ttl() time.Duration {
	switch {
	case s.TTL < 0:
		return 0
	case s.TTL == 0:
		return TTLDefault
	}
	return s.TTL
}

// Put writes data under ptr's key (one of this convention's).
func (s *Store) Put(ctx context.Context, ptr string, data []byte) error {
	key, err := Key(ptr)
	if err != nil {
		return err
	}
	if n := int64(len(data)); n > s.maxBytes() {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, n, s.maxBytes())
	}
	if s.Client == nil {
		return errors.New("jobdata: store has no Redis client")
	}
	if err := s.Client.Set(ctx, key, data, s.ttl()).Err(); err != nil {
		return fmt.Errorf("jobdata: write %s: %w", ptr, err)
	}
	return nil
}

// PutInput stores jobID's input and returns its context_ptr.
func (s *Store) PutInput(ctx context.Context, jobID string, data []byte) (string, error) {
	ptr := InputPointer(jobID)
	return ptr, s.Put(ctx, ptr, data)
}

// PutResult stores jobID's result and returns its result_ptr.
func (s *Store) PutResult(ctx context.Context, jobID string, data []byte) (string, error) {
	ptr := ResultPointer(jobID)
	return ptr, s.Put(ctx, ptr, data)
}

// Get reads the whole value behind ptr (bounded by MaxBytes: a longer
// value, written by someone else, is ErrTooLarge).
func (s *Store) Get(ctx context.Context, ptr string) ([]byte, error) {
	data, size, err := s.Read(ctx, ptr, s.maxBytes())
	if err != nil {
		return nil, err
	}
	if size > int64(len(data)) {
		return nil, fmt.Errorf("%w: %s holds %d bytes, at most %d are read", ErrTooLarge, ptr, size, s.maxBytes())
	}
	return data, nil
}

// Read returns at most max bytes of the value behind ptr and the value's
// full size, in one round trip.
func (s *Store) Read(ctx context.Context, ptr string, max int64) ([]byte, int64, error) {
	key, err := Key(ptr)
	if err != nil {
		return nil, 0, err
	}
	if s.Client == nil {
		return nil, 0, errors.New("jobdata: store has no Redis client")
	}
	var size *redis.IntCmd
	var get *redis.StringCmd
	_, err = s.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		size = p.StrLen(ctx, key)
		get = p.GetRange(ctx, key, 0, max-1)
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("jobdata: read %s: %w", ptr, err)
	}
	if size.Val() == 0 {
		// STRLEN is 0 for a missing key; an empty value is told apart.
		if n, err := s.Client.Exists(ctx, key).Result(); err != nil || n == 0 {
			return nil, 0, fmt.Errorf("%w: %s", ErrMissing, ptr)
		}
	}
	return []byte(get.Val()), size.Val(), nil
}

// ContentType names what data is: JSON, UTF-8 text, or bytes.
func ContentType(data []byte) string {
	switch {
	case json.Valid(data):
		return TypeJSON
	case utf8.Valid(data):
		return TypeText
	}
	return TypeBinary
}
