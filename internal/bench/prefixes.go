package bench

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
)

// Prefixes are one run's names: every key, subject and stream of a run
// carries its run id, so runs never collide with each other, with a node in
// production use, or with tests sharing the servers, and cleanup is exact.
type Prefixes struct {
	Key     string // Redis keys: "bench:<run>:"
	Subject string // CAP subjects: "bench-<run>.sys.job.submit", ...
	Stream  string // JetStream streams: "BENCH_<RUN>_SUBMIT", ...
}

// PrefixesFor returns run's prefixes.
func PrefixesFor(run string) Prefixes {
	return Prefixes{Key: "bench:" + run + ":", Subject: "bench-" + run, Stream: "BENCH_" + strings.ToUpper(run)}
}

// NodeCommand is the command that starts an external node for run, as the
// bench prints it for --node external.
func NodeCommand(run string) string {
	p := PrefixesFor(run)
	return fmt.Sprintf("troupe node --key-prefix %s --subject-prefix %s --stream-prefix %s", p.Key, p.Subject, p.Stream)
}

// maxRunIDLength keeps job ids (run id + index) well under the node's
// 128-character id limit.
const maxRunIDLength = 32

func newRunID() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return "r" + hex.EncodeToString(b[:])
}

// validRunID accepts [a-z0-9] only: the id becomes a key segment, a subject
// token and (upper-cased) a stream name.
func validRunID(id string) error {
	if id == "" || len(id) > maxRunIDLength {
		return fmt.Errorf("%w: run id must have 1..%d characters", ErrConfig, maxRunIDLength)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return fmt.Errorf("%w: run id %q: only a-z and 0-9", ErrConfig, id)
		}
	}
	return nil
}
