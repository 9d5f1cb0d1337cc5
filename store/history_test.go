package store_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/store"
)

// wantEntry is what a test expects of one history entry.
type wantEntry struct {
	from, to core.State
	reason   core.Reason
	node     string
	elided   int
}

// bounded returns what the store keeps of the full history all: all of it
// up to HistoryHead + HistoryTail entries, else the head, one marker for
// the entries in between and the tail.
func bounded(all []wantEntry) []wantEntry {
	if len(all) <= store.HistoryHead+store.HistoryTail {
		return all
	}
	cut := all[store.HistoryHead : len(all)-store.HistoryTail]
	out := append([]wantEntry{}, all[:store.HistoryHead]...)
	out = append(out, wantEntry{from: cut[0].from, to: cut[len(cut)-1].to, reason: store.HistoryElided, elided: len(cut)})
	return append(out, all[len(all)-store.HistoryTail:]...)
}

func checkHistory(t *testing.T, got []store.HistoryEntry, want []wantEntry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("history has %d entries, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if w.node == "" && w.elided == 0 {
			w.node = "a"
		}
		if g.From != w.from || g.To != w.to || g.Reason != w.reason || g.Elided != w.elided || g.Node != w.node {
			t.Fatalf("entry %d is %s → %s %s @%q (elided %d), want %s → %s %s @%q (elided %d)", i,
				g.From, g.To, g.Reason, g.Node, g.Elided, w.from, w.to, w.reason, w.node, w.elided)
		}
		if g.At.IsZero() {
			t.Fatalf("entry %d has no time", i)
		}
	}
}

// historyFields returns the record's history fields that hold entries
// ("h" and a number), by number.
func historyFields(t *testing.T, b *bundle, id string) map[int]string {
	t.Helper()
	all, err := b.s.Client().HGetAll(context.Background(), b.s.Keys().Job(id)).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for f, v := range all {
		if n, err := strconv.Atoi(strings.TrimPrefix(f, "h")); err == nil && strings.HasPrefix(f, "h") {
			out[n] = v
		}
	}
	return out
}

// checkRing checks the record's entry fields against the full history all
// (reasons are unique in it): entry i is in field h<i> for i < 16 and in
// h<16 + (i-16) mod 240> after that, no other field holds an entry, every
// value is at most 64 bytes, and hn counts all entries.
func checkRing(t *testing.T, b *bundle, id string, all []wantEntry) {
	t.Helper()
	fields := historyFields(t, b, id)
	n := len(all)
	if want := min(n, 256); len(fields) != want {
		t.Fatalf("the record has %d entry fields, want %d", len(fields), want)
	}
	for i := 0; i < n; i++ {
		slot := i
		if i >= 16 {
			slot = 16 + (i-16)%240
		}
		if i >= 16 && i < n-240 {
			continue // overwritten
		}
		v, ok := fields[slot]
		if !ok {
			t.Fatalf("entry %d: no field h%d", i, slot)
		}
		if p := strings.Split(v, "|"); len(p) < 3 || p[1] != string(all[i].to) || p[2] != string(all[i].reason) {
			t.Fatalf("entry %d: h%d is %q, want to %s reason %s", i, slot, v, all[i].to, all[i].reason)
		}
		if len(v) > 64 {
			t.Fatalf("entry %d: h%d is %d bytes: %q", i, slot, len(v), v)
		}
	}
	hn, err := b.s.Client().HGet(context.Background(), b.s.Keys().Job(id), "hn").Result()
	if err != nil || hn != strconv.Itoa(n) {
		t.Fatalf("hn is %q (%v), want %d", hn, err, n)
	}
}

// A job's history is fields of its record, bounded: past HistoryHead +
// HistoryTail entries it keeps the first HistoryHead and a ring of the
// latest HistoryTail, and GetJob puts one marker that counts the ones
// dropped in between. Nodes change between writes, and some hops are
// self-loops, so the entries the ring keeps must carry what the dropped
// ones said (the from state and node of the oldest kept one).
func TestHistoryIsBoundedWithARing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const id = "long"
	r := b.do(t, &store.Op{Kind: store.OpActivate, JobID: id, Node: "a", Create: true, Topic: "job.x",
		T: &store.Transition{Path: []store.Hop{{To: core.StateScheduled, Reason: "r0"}}}})
	if r.Status != store.ActivateCreated {
		t.Fatalf("create: %+v", r)
	}
	all := []wantEntry{{"", core.StatePending, core.ReasonSubmitted, "a", 0}, {core.StatePending, core.StateScheduled, "r0", "a", 0}}
	cycle := []core.State{core.StatePending, core.StateApprovalRequired, core.StateScheduled, core.StateScheduled}
	nodes := []string{"a", "a", "node-b", "c"}
	st := core.StateScheduled
	// Writes of 1 to 7 hops each, so that appends cross the bound, and
	// later the ring's wrap, by several entries at once as well as by one.
	for op, hop := 0, 1; len(all) < 3*(store.HistoryHead+store.HistoryTail)+9; op++ {
		var path []store.Hop
		from := st
		node := nodes[op%len(nodes)]
		for k := 0; k <= op%7; k++ {
			to := cycle[hop%len(cycle)]
			reason := core.Reason("r" + strconv.Itoa(hop))
			path = append(path, store.Hop{To: to, Reason: reason})
			all = append(all, wantEntry{st, to, reason, node, 0})
			st = to
			hop++
		}
		res := b.do(t, &store.Op{Kind: store.OpTransition, JobID: id, Node: node, LockValue: "a|1",
			T: &store.Transition{Expect: store.Expect(from), Path: path}})
		if !res.OK() {
			t.Fatalf("write %d: %+v", op, res)
		}
		n := len(all)
		near := func(bound int) bool { return n >= bound-8 && n <= bound+8 }
		if op%10 == 0 || near(store.HistoryHead+store.HistoryTail) || near(store.HistoryHead+store.HistoryTail+20) ||
			near(store.HistoryHead+2*store.HistoryTail) {
			rec, err := b.s.GetJob(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			checkHistory(t, rec.History, bounded(all))
			checkRing(t, b, id, all)
		}
	}
	rec, err := b.s.GetJob(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	checkHistory(t, rec.History, bounded(all))
	checkRing(t, b, id, all)
	for f := range rec.Fields {
		if store.IsHistoryField(f) {
			t.Fatalf("Fields holds the history's %s", f)
		}
	}
	// An adoption hands the record's fields to the new owner, but not its
	// history.
	if err := b.s.Client().Del(ctx, b.s.Keys().Lock(id)).Err(); err != nil {
		t.Fatal(err)
	}
	ar := b.activate(t, id, "b", false)
	if ar.Status != store.ActivateAdopted || ar.Fields["s"] != string(st) {
		t.Fatalf("adoption: %+v", ar)
	}
	for f := range ar.Fields {
		if store.IsHistoryField(f) {
			t.Fatalf("the adoption's fields hold the history's %s", f)
		}
	}
	// The new owner's first entry names it.
	res := b.do(t, &store.Op{Kind: store.OpTransition, JobID: id, Node: "b", LockValue: store.LockValue("b", ar.Fence),
		T: &store.Transition{Expect: store.Expect(st), Path: []store.Hop{{To: core.StateCancelled, Reason: "adopted"}}}})
	if !res.OK() {
		t.Fatalf("the new owner's write: %+v", res)
	}
	rec, err = b.s.GetJob(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	all = append(all, wantEntry{st, core.StateCancelled, "adopted", "b", 0})
	checkHistory(t, rec.History, bounded(all))
	checkRing(t, b, id, all)
}

// The record's fields a Transition sets cannot overwrite the history, and a
// reason with the entry's separator in it cannot break the entry.
func TestHistoryKeepsItsFieldsAndSeparators(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.activate(t, "sep", "a", true)
	r := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "sep", Node: "a", LockValue: "a|1",
		T: &store.Transition{Expect: store.Expect(core.StatePending),
			Path: []store.Hop{{To: core.StateScheduled, Reason: "bad|reason\nhere"}},
			Fields: []string{"h0", "overwritten", "hn", "99", "h7", "x", "hx", "y", "hu", "1", "hb", "2",
				"hl", "z", "kept", "yes", "h", "yes"}}})
	if !r.OK() {
		t.Fatalf("write: %+v", r)
	}
	rec, err := b.s.GetJob(ctx, "sep")
	if err != nil {
		t.Fatal(err)
	}
	checkHistory(t, rec.History, []wantEntry{{"", core.StatePending, core.ReasonSubmitted, "a", 0},
		{core.StatePending, core.StateScheduled, "bad_reason_here", "a", 0}})
	if rec.Fields["kept"] != "yes" || rec.Fields["h"] != "yes" {
		t.Fatalf("the caller's other fields were not written: %v", rec.Fields)
	}
	for _, f := range []string{"h7", "hx", "hb", "hl"} {
		if b.s.Client().HExists(ctx, b.s.Keys().Job("sep"), f).Val() {
			t.Fatalf("the caller wrote the history's %s", f)
		}
	}
}

// The record of a job created straight into DISPATCHED and finished (the
// happy path) stays a compact hash (Redis's listpack): every value of the
// history is at most 64 bytes (hash-max-listpack-value) and the history
// adds only a few fields.
func TestHistoryKeepsASmallRecordCompact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := b.s.Client()
	for _, id := range []string{"small"} {
		r := b.do(t, &store.Op{Kind: store.OpActivate, JobID: id, Node: "troupe-7d9f8b6c5-x2k4p-1", Create: true,
			Topic: "job.echo", Tenant: "t", TraceID: "tr", Request: []byte("req"),
			T: &store.Transition{Path: []store.Hop{{To: core.StateScheduled, Reason: core.ReasonAllowed},
				{To: core.StateDispatched, Reason: core.ReasonDispatched}},
				Due: time.Now().Add(time.Minute).UnixMilli(), Fields: []string{"worker", "w1", "subj", "cap.w1"}}})
		if r.Status != store.ActivateCreated {
			t.Fatalf("create: %+v", r)
		}
		encoding := func(when string) {
			enc, err := c.ObjectEncoding(ctx, b.s.Keys().Job(id)).Result()
			if err != nil {
				t.Skipf("OBJECT ENCODING: %v", err) // not a real Redis
			}
			mem, _ := c.MemoryUsage(ctx, b.s.Keys().Job(id), 0).Result()
			t.Logf("%s %s: %s, %d bytes", id, when, enc, mem)
			if enc != "listpack" && enc != "ziplist" {
				t.Fatalf("%s %s: the record is a %s", id, when, enc)
			}
		}
		encoding("after create")
		r = b.do(t, &store.Op{Kind: store.OpTransition, JobID: id, Node: "troupe-7d9f8b6c5-x2k4p-1",
			LockValue: store.LockValue("troupe-7d9f8b6c5-x2k4p-1", 1),
			T: &store.Transition{Expect: store.Expect(core.StateDispatched),
				Path: []store.Hop{{To: core.StateRunning, Reason: core.ReasonStarted},
					{To: core.StateSucceeded, Reason: core.ReasonCompleted}},
				Fields: []string{"result_ptr", "p"}}})
		if r.Step != store.StepOK {
			t.Fatalf("finish: %+v", r)
		}
		encoding("after terminal")
		t.Logf("record: %v", c.HGetAll(ctx, b.s.Keys().Job(id)).Val())
		for f, v := range historyFields(t, b, id) {
			if len(v) > 64 {
				t.Fatalf("h%d is %d bytes: %q", f, len(v), v)
			}
		}
	}
}

// oldRecord writes a job as the version before the history moved into the
// record did: a record without the history field, and a list of entries.
func oldRecord(t *testing.T, b *bundle, id string, st core.State, lock string, entries []string) {
	t.Helper()
	ctx := context.Background()
	k := b.s.Keys()
	nowMs := time.Now().UnixMilli()
	now := strconv.FormatInt(nowMs, 10)
	pipe := b.s.Client().Pipeline()
	pipe.HSet(ctx, k.Job(id), "s", string(st), "fence", 1, "topic", "job.x", "tenant", "t", "created", now,
		"updated", now, "node", "a", "reason", "old", "attempts", 0)
	if strings.HasPrefix(id, "nocreated") {
		pipe.HDel(ctx, k.Job(id), "created")
	}
	list := make([]interface{}, len(entries))
	for i, e := range entries {
		list[i] = e
	}
	pipe.RPush(ctx, k.LegacyHistory(id), list...)
	pipe.ZAdd(ctx, k.Index(store.Shard(id), string(st)), redis.Z{Score: float64(nowMs), Member: id})
	if lock != "" {
		pipe.Set(ctx, k.Lock(id), lock, time.Minute)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// A record an older version wrote keeps its history in a list: GetJob
// reads it there, and the first write of this version moves it into the
// record (bounded like any history) and deletes the list.
func TestHistoryOfAnOlderVersionsRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	k := b.s.Keys()
	now := time.Now().UnixMilli()
	// The list's entries are a millisecond apart, going back from now, so
	// that their times after the move into the record can be checked.
	var times []int64
	entry := func(from, to core.State, reason string) string {
		times = append(times, now-10_000+int64(len(times)))
		return fmt.Sprintf("%d|%s|%s|%s|a", times[len(times)-1], from, to, reason)
	}
	checkTimes := func(got []store.HistoryEntry, want []int64) {
		t.Helper()
		for i, ms := range want {
			if got[i].At.UnixMilli() != ms {
				t.Fatalf("entry %d is at %d, want %d", i, got[i].At.UnixMilli(), ms)
			}
		}
	}

	// A live job: read from the list, then moved by its next transition.
	oldRecord(t, b, "old1", core.StateDispatched, "a|1", []string{entry("", core.StatePending, "submitted"),
		entry(core.StatePending, core.StateScheduled, "policy_allowed"),
		entry(core.StateScheduled, core.StateDispatched, "dispatched")})
	old := []wantEntry{{"", core.StatePending, core.ReasonSubmitted, "a", 0},
		{core.StatePending, core.StateScheduled, core.ReasonAllowed, "a", 0},
		{core.StateScheduled, core.StateDispatched, core.ReasonDispatched, "a", 0}}
	rec, err := b.s.GetJob(ctx, "old1")
	if err != nil {
		t.Fatal(err)
	}
	checkHistory(t, rec.History, old)
	if sr := b.step(t, "old1", "a", 1, core.StateDispatched, core.StateSucceeded); sr.Step != store.StepOK {
		t.Fatalf("finish: %+v", sr)
	}
	rec, err = b.s.GetJob(ctx, "old1")
	if err != nil {
		t.Fatal(err)
	}
	checkHistory(t, rec.History, append(old, wantEntry{core.StateDispatched, core.StateSucceeded, "test", "a", 0}))
	checkTimes(rec.History, times)
	if n := b.s.Client().Exists(ctx, k.LegacyHistory("old1")).Val(); n != 0 {
		t.Fatal("the old list survived the move into the record")
	}

	// A record without "created" (the base of the entries' times): the
	// move writes one (hb).
	times = nil
	oldRecord(t, b, "nocreated", core.StateDispatched, "a|1", []string{entry("", core.StatePending, "submitted"),
		entry(core.StatePending, core.StateScheduled, "policy_allowed"),
		entry(core.StateScheduled, core.StateDispatched, "dispatched")})
	if sr := b.step(t, "nocreated", "a", 1, core.StateDispatched, core.StateSucceeded); sr.Step != store.StepOK {
		t.Fatalf("finish: %+v", sr)
	}
	rec, err = b.s.GetJob(ctx, "nocreated")
	if err != nil {
		t.Fatal(err)
	}
	checkHistory(t, rec.History, append(old, wantEntry{core.StateDispatched, core.StateSucceeded, "test", "a", 0}))
	checkTimes(rec.History, times)
	if at := rec.History[3].At; time.Since(at) > time.Minute || time.Since(at) < 0 {
		t.Fatalf("the new entry is at %v", at)
	}
	if !b.s.Client().HExists(ctx, k.Job("nocreated"), "hb").Val() || !rec.Created.IsZero() {
		t.Fatalf("a record without created: hb not written, or created is %v", rec.Created)
	}

	// A SUCCEEDED job that is downgraded; its old list is longer than the
	// bound, so that the move drops entries of its own.
	times = nil
	var long []string
	var all []wantEntry
	for i := 0; i < store.HistoryHead+store.HistoryTail+50; i++ {
		reason := "r" + strconv.Itoa(i)
		long = append(long, entry(core.StateScheduled, core.StateScheduled, reason))
		all = append(all, wantEntry{core.StateScheduled, core.StateScheduled, core.Reason(reason), "a", 0})
	}
	long = append(long, entry(core.StateScheduled, core.StateSucceeded, "done"))
	all = append(all, wantEntry{core.StateScheduled, core.StateSucceeded, "done", "a", 0})
	oldRecord(t, b, "old2", core.StateSucceeded, "", long)
	rec, err = b.s.GetJob(ctx, "old2")
	if err != nil {
		t.Fatal(err)
	}
	checkHistory(t, rec.History, all)
	r := b.do(t, &store.Op{Kind: store.OpDowngrade, JobID: "old2", Node: "a",
		T: &store.Transition{Path: []store.Hop{{To: core.StateOutputQuarantined, Reason: core.ReasonOutputQuarantined}}}})
	if r.Step != store.StepOK {
		t.Fatalf("downgrade: %+v", r)
	}
	rec, err = b.s.GetJob(ctx, "old2")
	if err != nil {
		t.Fatal(err)
	}
	all = append(all, wantEntry{core.StateSucceeded, core.StateOutputQuarantined, core.ReasonOutputQuarantined, "a", 0})
	checkHistory(t, rec.History, bounded(all))
	checkRing(t, b, "old2", all)
	// The head's times, the marker's (the first dropped entry's) and the
	// tail's.
	kept := append(append(append([]int64{}, times[:store.HistoryHead]...), times[store.HistoryHead]),
		times[len(times)-store.HistoryTail+1:]...)
	checkTimes(rec.History, kept)
	if n := b.s.Client().Exists(ctx, k.LegacyHistory("old2")).Val(); n != 0 {
		t.Fatal("the old list survived the downgrade")
	}
}

// While versions mix (a rolling upgrade), an older node may write to a job
// that this version wrote before: its entries go to the list, which GetJob
// reads after the field's, and which the next write of this version moves
// into the record.
func TestHistoryWrittenByBothVersions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	k := b.s.Keys()
	b.activate(t, "mixed", "a", true)
	if sr := b.step(t, "mixed", "a", 1, core.StatePending, core.StateScheduled); sr.Step != store.StepOK {
		t.Fatalf("step: %+v", sr)
	}
	// The older version's transition SCHEDULED → DISPATCHED, as it wrote
	// it: the record's fields and an entry in the list.
	later := time.Now().UnixMilli() + 5
	pipe := b.s.Client().Pipeline()
	pipe.HSet(ctx, k.Job("mixed"), "s", string(core.StateDispatched), "updated", later, "reason", "dispatched")
	pipe.RPush(ctx, k.LegacyHistory("mixed"), fmt.Sprintf("%d|SCHEDULED|DISPATCHED|dispatched|a", later))
	pipe.ZRem(ctx, k.Index(store.Shard("mixed"), string(core.StateScheduled)), "mixed")
	pipe.ZAdd(ctx, k.Index(store.Shard("mixed"), string(core.StateDispatched)), redis.Z{Score: float64(later), Member: "mixed"})
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	want := []wantEntry{{"", core.StatePending, core.ReasonSubmitted, "a", 0}, {core.StatePending, core.StateScheduled, "test", "a", 0},
		{core.StateScheduled, core.StateDispatched, core.ReasonDispatched, "a", 0}}
	rec, err := b.s.GetJob(ctx, "mixed")
	if err != nil {
		t.Fatal(err)
	}
	checkHistory(t, rec.History, want)
	if sr := b.step(t, "mixed", "a", 1, core.StateDispatched, core.StateSucceeded); sr.Step != store.StepOK {
		t.Fatalf("finish: %+v", sr)
	}
	rec, err = b.s.GetJob(ctx, "mixed")
	if err != nil {
		t.Fatal(err)
	}
	checkHistory(t, rec.History, append(want, wantEntry{core.StateDispatched, core.StateSucceeded, "test", "a", 0}))
	if n := b.s.Client().Exists(ctx, k.LegacyHistory("mixed")).Val(); n != 0 {
		t.Fatal("the list survived the write that moved it")
	}
	for f := range rec.Fields {
		if store.IsHistoryField(f) {
			t.Fatalf("Fields holds the history's %s", f)
		}
	}
}

// ParseHistory rebuilds entries from the record's fields: times from the
// base ("hb", else "created"), the from state and node from the entry
// before unless written, the ring's order from hn, and the marker from hx.
func TestParseHistory(t *testing.T) {
	t.Parallel()
	got := store.ParseHistory(map[string]string{"created": "1000", "hn": "4",
		"h0": "0|PENDING|submitted|n1", "h1": "5|SCHEDULED|policy_allowed", "h2": "7|SCHEDULED|again|n2",
		"h3": "-2|RUNNING|odd|n2|DISPATCHED", "h4": "9|FAILED|not_counted"})
	want := []store.HistoryEntry{
		{At: time.UnixMilli(1000), To: core.StatePending, Reason: core.ReasonSubmitted, Node: "n1"},
		{At: time.UnixMilli(1005), From: core.StatePending, To: core.StateScheduled, Reason: core.ReasonAllowed, Node: "n1"},
		{At: time.UnixMilli(1007), From: core.StateScheduled, To: core.StateScheduled, Reason: "again", Node: "n2"},
		{At: time.UnixMilli(998), From: core.StateDispatched, To: core.StateRunning, Reason: "odd", Node: "n2"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	// hb, when there, is the base.
	got = store.ParseHistory(map[string]string{"created": "1000", "hb": "2000", "hn": "1", "h0": "3|PENDING|submitted|n1"})
	if len(got) != 1 || got[0].At != time.UnixMilli(2003) {
		t.Fatalf("with hb: %+v", got)
	}

	// 300 entries: entry i has dt i and reason r<i>; the ring's fields hold
	// the latest 240, oldest at h<16 + (300-240-16) mod 240>.
	const n = 300
	rec := map[string]string{"created": "0", "hn": strconv.Itoa(n), "hx": "16|SCHEDULED|n9"}
	for i := 0; i < n; i++ {
		slot := i
		if i >= 16 {
			slot = 16 + (i-16)%240
		}
		v := fmt.Sprintf("%d|SCHEDULED|r%d", i, i)
		if i == 0 {
			v += "|n1"
		}
		rec["h"+strconv.Itoa(slot)] = v
	}
	got = store.ParseHistory(rec)
	if len(got) != 16+1+240 {
		t.Fatalf("%d entries", len(got))
	}
	for k, e := range got {
		i, node := k, "n1"
		switch {
		case k == 16:
			m := store.HistoryEntry{At: time.UnixMilli(16), From: core.StateScheduled, To: core.StateScheduled,
				Reason: store.HistoryElided, Elided: n - 256}
			if e != m {
				t.Fatalf("marker %+v, want %+v", e, m)
			}
			continue
		case k > 16:
			i, node = n-240+k-17, "n9"
		}
		from := core.StateScheduled
		if i == 0 {
			from = ""
		}
		w := store.HistoryEntry{At: time.UnixMilli(int64(i)), From: from, To: core.StateScheduled,
			Reason: core.Reason("r" + strconv.Itoa(i)), Node: node}
		if e != w {
			t.Fatalf("entry %d is %+v, want %+v", k, e, w)
		}
	}
	// A first dropped entry that wrote its from state passes it to hx.
	rec["hx"] = "16|SCHEDULED|n9|PENDING"
	if m := store.ParseHistory(rec)[16]; m.From != core.StatePending || m.To != core.StateScheduled {
		t.Fatalf("marker %+v", m)
	}
	// The head's fields alone (store.HistoryHeadFields) give the head.
	head := map[string]string{}
	for _, f := range store.HistoryHeadFields() {
		if v, ok := rec[f]; ok {
			head[f] = v
		}
	}
	got = store.ParseHistory(head)
	if len(got) != 17 || got[15].Reason != "r15" || got[16].Elided != n-256 {
		t.Fatalf("from the head's fields: %+v", got)
	}
}
