package store

import (
	"strconv"
	"strings"
)

// A job's create writes fewer record fields than the record shows its
// readers (each field a create writes costs Redis ~0.4 µs, issue #33):
//
//   - the policy decision's fields (policy_decision, policy_reason,
//     rule_id, policy_snapshot), which only operators read, go into one
//     field, fieldPacked: "<name>:<len>:<value>" after one another;
//   - "fence" is left out while it is 1 (activate.lua's adoption counts
//     from a missing fence as from 1);
//   - "node" is left out while it is the creator, the first hop's node (an
//     adoption writes it).
//
// ExpandRecord puts them back into a record's field map, so every reader
// (GetJob, the adoption's fields, the admin API, inspect) sees the fields
// a record written before this, by an older node, has. A field written
// plain after the create (a later write of the same name) wins over its
// packed value.
const fieldPacked = "pd"

// packedFields are the record fields a create packs into fieldPacked.
var packedFields = [...]string{"policy_decision", "policy_reason", "rule_id", "policy_snapshot"}

// packCreate returns fieldPacked's value for a create: topic, tenant and
// trace, then the packable fields among fields (name, value pairs).
func packCreate(topic, tenant, trace string, fields []string) string {
	var b strings.Builder
	b.Grow(len(topic) + len(tenant) + len(trace) + 32 + 64)
	packOne(&b, "topic", topic)
	packOne(&b, "tenant", tenant)
	packOne(&b, "trace", trace)
	for i := 0; i+1 < len(fields); i += 2 {
		if packable(fields[i]) {
			packOne(&b, fields[i], fields[i+1])
		}
	}
	return b.String()
}

func packOne(b *strings.Builder, name, value string) {
	b.WriteString(name)
	b.WriteByte(':')
	b.WriteString(strconv.Itoa(len(value)))
	b.WriteByte(':')
	b.WriteString(value)
}

func packable(name string) bool {
	for _, p := range packedFields {
		if name == p {
			return true
		}
	}
	return false
}

// unpacked returns field name of a fieldPacked value ("" when absent).
func unpacked(v, name string) string {
	out := ""
	unpackFields(v, func(n, value string) {
		if n == name {
			out = value
		}
	})
	return out
}

// unpackFields calls set for each name, value in a fieldPacked value; a
// malformed rest is dropped.
func unpackFields(v string, set func(name, value string)) {
	for v != "" {
		name, rest, ok := strings.Cut(v, ":")
		if !ok {
			return
		}
		l, rest, ok := strings.Cut(rest, ":")
		n, err := strconv.Atoi(l)
		if !ok || err != nil || n < 0 || n > len(rest) {
			return
		}
		set(name, rest[:n])
		v = rest[n:]
	}
}

// ExpandRecord restores, in f (a job record's fields, as HGETALL reads
// them), the fields a create leaves out or packs: the packed fields,
// "fence" (1) and "node" (the first hop's); and those a worker's result
// leaves out (a record with "result_ptr"): "execution_ms" (0) and "worker"
// (none: the dispatch's is there whenever there was one). A record without
// a state ("s") is left alone; so is one an older node wrote.
func ExpandRecord(f map[string]string) {
	if f["s"] == "" {
		return
	}
	if v, ok := f[fieldPacked]; ok {
		delete(f, fieldPacked)
		unpackFields(v, func(name, value string) {
			if _, plain := f[name]; !plain {
				f[name] = value
			}
		})
	}
	if _, ok := f["fence"]; !ok {
		f["fence"] = "1"
	}
	if _, ok := f["node"]; !ok {
		if h1 := f["h1"]; h1 != "" {
			f["node"] = h1[strings.LastIndexByte(h1, '|')+1:]
		}
	}
	if _, ok := f["result_ptr"]; ok {
		if _, ok := f["execution_ms"]; !ok {
			f["execution_ms"] = "0"
		}
		if _, ok := f["worker"]; !ok {
			f["worker"] = ""
		}
	}
}
