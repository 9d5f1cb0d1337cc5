package store

import (
	"strconv"
	"strings"
	"time"

	"github.com/troupe-run/troupe/core"
)

// A job's history is kept in its record: hop fields written by the job
// scripts (lua/lib/hops.lua). A separate list key per job cost Redis more
// than the rest of the job's writes together (a key to create, expire and
// delete); jobs written before the change keep their list, which the
// scripts go on appending to.

// History decodes a job's history from its record's fields (hop fields, see
// lua/lib/hops.lua) and, for a job written before those, its history list
// (lines "unix_ms|from|to|reason|node"), oldest first. Malformed entries
// are skipped.
func History(fields map[string]string, list []string) []HistoryEntry {
	n, _ := strconv.Atoi(fields["hn"])
	out := make([]HistoryEntry, 0, len(list)+n)
	for _, line := range list {
		if e, ok := parseHistory(line); ok {
			out = append(out, e)
		}
	}
	created, _ := strconv.ParseInt(fields["created"], 10, 64)
	var from core.State
	node := ""
	for i := 1; i <= n; i++ {
		p := strings.SplitN(fields["h"+strconv.Itoa(i)], "|", 4)
		if len(p) != 4 {
			continue
		}
		delta, err := strconv.ParseInt(p[0], 10, 64)
		if err != nil {
			continue
		}
		if p[3] != "" {
			node = p[3]
		}
		to := core.State(p[1])
		out = append(out, HistoryEntry{At: time.UnixMilli(created + delta), From: from, To: to,
			Reason: core.Reason(p[2]), Node: node})
		from = to
	}
	return out
}

// parseHistory parses a line of a history list, "unix_ms|from|to|reason|node".
func parseHistory(line string) (HistoryEntry, bool) {
	p := strings.SplitN(line, "|", 5)
	if len(p) != 5 {
		return HistoryEntry{}, false
	}
	return HistoryEntry{At: parseMillis(p[0]), From: core.State(p[1]), To: core.State(p[2]),
		Reason: core.Reason(p[3]), Node: p[4]}, true
}
