package store

import (
	"strconv"
	"strings"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// A job's history is kept in its record: hop fields written by the job
// scripts (lua/lib/hops.lua). A separate list key per job would cost Redis
// more than the rest of the job's writes together (a key to create, expire
// and delete).

// Record fields a job's create writes about the time before it (see
// lifecycle.Job.historyFields), in unix ms: when its submit was stored, and
// when its wait for room began. History dates the first hop (PENDING) by
// the one and the SCHEDULED hop written with the create by the other, so a
// job that waited before its record existed shows the wait as its own step.
const (
	FieldSubmitted = jobstate.FieldSubmitted
	FieldWaited    = jobstate.FieldWaited
)

// History decodes a job's history from its record's fields (hop fields, see
// lua/lib/hops.lua), oldest first. Malformed entries are skipped.
func History(fields map[string]string) []HistoryEntry {
	n, _ := strconv.Atoi(fields["hn"])
	out := make([]HistoryEntry, 0, n)
	created, _ := strconv.ParseInt(fields["created"], 10, 64)
	submitted, _ := strconv.ParseInt(fields[FieldSubmitted], 10, 64)
	waited, _ := strconv.ParseInt(fields[FieldWaited], 10, 64)
	var from jobstate.State
	node := ""
	var first int64 // the first hop's delta: the create's
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
		to := jobstate.State(p[1])
		at := created + delta
		switch {
		case i == 1:
			first = delta
			if submitted > 0 && submitted < at {
				at = submitted
			}
		case delta == first && to == jobstate.StateScheduled && waited > 0 && waited < at:
			at = waited // the wait that came before the create
			waited = 0
		}
		out = append(out, HistoryEntry{At: time.UnixMilli(at), From: from, To: to,
			Reason: jobstate.Reason(p[2]), Node: node})
		from = to
	}
	return out
}
