package store

import (
	"strconv"
	"strings"
	"time"

	"github.com/troupe-run/troupe/core"
)

// A job's history is kept in fields of its record (Keys.Job), one field
// per entry, written by the scripts that record transitions (see
// lua/lib/history.lua, which describes the fields and their values):
// entry i (from 0) is in field "h<i>" for i < HistoryHead and in the ring
// "h<HistoryHead + (i-HistoryHead) mod HistoryTail>" after that; "hn"
// counts the entries the job has had, "hu" is the record's "updated" as of
// the last write of the history, "hl" the last entry's node (for the
// scripts), "hb" the base of the entries' times when the record had no
// "created", and "hx" says what the ring dropped.
const (
	// HistoryHead is how many of a job's first entries a history keeps.
	HistoryHead = 16
	// HistoryTail is how many of a job's latest entries a history keeps.
	HistoryTail = 240
	// HistoryElided is the reason of the marker entry that ParseHistory
	// puts in place of the entries a history dropped.
	HistoryElided core.Reason = "history_elided"

	historyCountField   = "hn"
	historyUpdatedField = "hu"
	// historyLastNodeField is the last entry's node when it differs from
	// entry 0's: the scripts' business, not the readers'.
	historyLastNodeField = "hl"
	historyBaseField     = "hb"
	historyDroppedField  = "hx"
)

// historySlot returns the record's field that holds entry i (from 0).
func historySlot(i int) string {
	if i >= HistoryHead {
		i = HistoryHead + (i-HistoryHead)%HistoryTail
	}
	return "h" + strconv.Itoa(i)
}

// IsHistoryField reports whether field is one of the history's fields of a
// record ("h" and digits, "hn", "hu", "hl", "hb", "hx").
func IsHistoryField(field string) bool {
	switch field {
	case historyCountField, historyUpdatedField, historyLastNodeField, historyBaseField, historyDroppedField:
		return true
	}
	if len(field) < 2 || field[0] != 'h' {
		return false
	}
	for i := 1; i < len(field); i++ {
		if field[i] < '0' || field[i] > '9' {
			return false
		}
	}
	return true
}

// HistoryHeadFields returns the record's fields that ParseHistory needs for
// a history's first HistoryHead entries: a reader that wants no more (the
// first time a job reached a state, say) can HMGET these instead of the
// whole record.
func HistoryHeadFields() []string {
	out := []string{"created", historyBaseField, historyCountField}
	for i := range HistoryHead {
		out = append(out, historySlot(i))
	}
	return out
}

// ParseHistory returns the history held in rec, a record's fields (all of
// them as HGETALL gives them, or those HistoryHeadFields names), oldest
// first. Past HistoryHead + HistoryTail entries, a marker entry with reason
// HistoryElided stands, between the first HistoryHead and the latest
// HistoryTail, for the entries dropped (Elided). An entry whose field is
// missing or does not parse is skipped; this does not see the entries of a
// record an older version wrote last (see Store.GetJob).
func ParseHistory(rec map[string]string) []HistoryEntry {
	n, _ := strconv.Atoi(rec[historyCountField])
	if n <= 0 {
		return nil
	}
	base, err := strconv.ParseInt(rec[historyBaseField], 10, 64)
	if err != nil {
		base, _ = strconv.ParseInt(rec["created"], 10, 64)
	}
	out := make([]HistoryEntry, 0, min(n, HistoryHead+HistoryTail+1))
	// prev is the entry before the next one: the from state and node of an
	// entry that does not write them.
	var prev HistoryEntry
	add := func(i int) {
		v, ok := rec[historySlot(i)]
		if !ok {
			return
		}
		e, ok := parseHistoryValue(v, base, prev)
		if !ok {
			return
		}
		out = append(out, e)
		prev = e
	}
	for i := range min(n, HistoryHead) {
		add(i)
	}
	if dropped := n - HistoryHead - HistoryTail; dropped > 0 {
		// hx: "dt|to|node" or "dt|to|node|from", the first dropped entry's
		// time (and from state when its entry wrote one), the last dropped
		// entry's to state and node.
		m := HistoryEntry{From: prev.To, Reason: HistoryElided, Elided: dropped}
		p := strings.Split(rec[historyDroppedField], "|")
		if dt, err := strconv.ParseInt(p[0], 10, 64); err == nil {
			m.At = time.UnixMilli(base + dt)
		}
		if len(p) >= 3 {
			m.To = core.State(p[1])
			prev = HistoryEntry{To: m.To, Node: p[2]}
		}
		if len(p) >= 4 {
			m.From = core.State(p[3])
		}
		out = append(out, m)
	}
	for i := max(HistoryHead, n-HistoryTail); i < n; i++ {
		add(i)
	}
	return out
}

// parseHistoryValue parses one entry's value, "dt|to|reason",
// "dt|to|reason|node" or "dt|to|reason|node|from", with times relative to
// base (unix ms); prev is the entry before it, whose node and to state an
// entry that does not write them takes.
func parseHistoryValue(v string, base int64, prev HistoryEntry) (HistoryEntry, bool) {
	p := strings.Split(v, "|")
	if len(p) < 3 || len(p) > 5 {
		return HistoryEntry{}, false
	}
	e := HistoryEntry{From: prev.To, To: core.State(p[1]), Reason: core.Reason(p[2]), Node: prev.Node}
	if dt, err := strconv.ParseInt(p[0], 10, 64); err == nil {
		e.At = time.UnixMilli(base + dt)
	}
	if len(p) >= 4 {
		e.Node = p[3]
	}
	if len(p) == 5 {
		e.From = core.State(p[4])
	}
	return e, true
}

// parseLegacyHistory parses one entry of the list an older version kept a
// job's history in, "unix_ms|from|to|reason|node".
func parseLegacyHistory(line string) (HistoryEntry, bool) {
	p := strings.SplitN(line, "|", 5)
	if len(p) != 5 {
		return HistoryEntry{}, false
	}
	return HistoryEntry{At: parseMillis(p[0]), From: core.State(p[1]), To: core.State(p[2]),
		Reason: core.Reason(p[3]), Node: p[4]}, true
}
