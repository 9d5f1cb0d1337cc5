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
		if g.From != w.from || g.To != w.to || g.Reason != w.reason || g.Elided != w.elided {
			t.Fatalf("entry %d is %s → %s %s (elided %d), want %s → %s %s (elided %d)", i,
				g.From, g.To, g.Reason, g.Elided, w.from, w.to, w.reason, w.elided)
		}
		if g.At.IsZero() {
			t.Fatalf("entry %d has no time", i)
		}
		if w.elided == 0 && g.Node != "a" || w.elided > 0 && g.Node != "" {
			t.Fatalf("entry %d's node is %q", i, g.Node)
		}
	}
}

// A job's history is a field of its record, bounded: past HistoryHead +
// HistoryTail entries it keeps the first HistoryHead, one marker that
// counts the ones dropped, and the latest HistoryTail; each later write
// folds the oldest of the tail into the marker.
func TestHistoryIsBoundedWithAMarker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const id = "long"
	r := b.do(t, &store.Op{Kind: store.OpActivate, JobID: id, Node: "a", Create: true, Topic: "job.x",
		T: &store.Transition{Path: []store.Hop{{To: core.StateScheduled, Reason: "r0"}}}})
	if r.Status != store.ActivateCreated {
		t.Fatalf("create: %+v", r)
	}
	all := []wantEntry{{"", core.StatePending, core.ReasonSubmitted, 0}, {core.StatePending, core.StateScheduled, "r0", 0}}
	cycle := []core.State{core.StatePending, core.StateApprovalRequired, core.StateScheduled}
	st := core.StateScheduled
	// Writes of 1 to 7 hops each, so that appends cross the bound, and
	// later the marker, by several entries at once as well as by one.
	for op, hop := 0, 1; len(all) < 2*(store.HistoryHead+store.HistoryTail)+9; op++ {
		var path []store.Hop
		from := st
		for k := 0; k <= op%7; k++ {
			to := cycle[hop%len(cycle)]
			reason := core.Reason("r" + strconv.Itoa(hop))
			path = append(path, store.Hop{To: to, Reason: reason})
			all = append(all, wantEntry{st, to, reason, 0})
			st = to
			hop++
		}
		res := b.do(t, &store.Op{Kind: store.OpTransition, JobID: id, Node: "a", LockValue: "a|1",
			T: &store.Transition{Expect: store.Expect(from), Path: path}})
		if !res.OK() {
			t.Fatalf("write %d: %+v", op, res)
		}
		n := len(all)
		near := func(bound int) bool { return n >= bound-8 && n <= bound+8 }
		if op%10 == 0 || near(store.HistoryHead+store.HistoryTail) || near(store.HistoryHead+store.HistoryTail+20) {
			rec, err := b.s.GetJob(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			checkHistory(t, rec.History, bounded(all))
		}
	}
	rec, err := b.s.GetJob(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	checkHistory(t, rec.History, bounded(all))
	if _, ok := rec.Fields[store.HistoryField]; ok {
		t.Fatal("Fields holds the history field")
	}
	f, err := b.s.Client().HMGet(ctx, b.s.Keys().Job(id), store.HistoryField, "hn").Result()
	if err != nil {
		t.Fatal(err)
	}
	h, _ := f[0].(string)
	if n := strings.Count(h, "\n") + 1; n != store.HistoryHead+1+store.HistoryTail || f[1] != strconv.Itoa(n) {
		t.Fatalf("the field holds %d entries, hn %v", n, f[1])
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
	if _, ok := ar.Fields[store.HistoryField]; ok {
		t.Fatal("the adoption's fields hold the history")
	}
	for _, f := range []string{"hn", "hu"} {
		if _, ok := ar.Fields[f]; ok {
			t.Fatalf("the adoption's fields hold the history's %s", f)
		}
	}
}

// The record's fields a Transition sets cannot overwrite the history, and a
// reason with the entry's separators in it cannot break the entries.
func TestHistoryKeepsItsFieldsAndSeparators(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.activate(t, "sep", "a", true)
	r := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "sep", Node: "a", LockValue: "a|1",
		T: &store.Transition{Expect: store.Expect(core.StatePending),
			Path:   []store.Hop{{To: core.StateScheduled, Reason: "bad|reason\nhere"}},
			Fields: []string{store.HistoryField, "overwritten", "hn", "99"}}})
	if !r.OK() {
		t.Fatalf("write: %+v", r)
	}
	rec, err := b.s.GetJob(ctx, "sep")
	if err != nil {
		t.Fatal(err)
	}
	checkHistory(t, rec.History, []wantEntry{{"", core.StatePending, core.ReasonSubmitted, 0},
		{core.StatePending, core.StateScheduled, "bad_reason_here", 0}})
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
	entry := func(from, to core.State, reason string) string {
		return fmt.Sprintf("%d|%s|%s|%s|a", now, from, to, reason)
	}

	// A live job: read from the list, then moved by its next transition.
	oldRecord(t, b, "old1", core.StateDispatched, "a|1", []string{entry("", core.StatePending, "submitted"),
		entry(core.StatePending, core.StateScheduled, "policy_allowed"),
		entry(core.StateScheduled, core.StateDispatched, "dispatched")})
	old := []wantEntry{{"", core.StatePending, core.ReasonSubmitted, 0},
		{core.StatePending, core.StateScheduled, core.ReasonAllowed, 0},
		{core.StateScheduled, core.StateDispatched, core.ReasonDispatched, 0}}
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
	checkHistory(t, rec.History, append(old, wantEntry{core.StateDispatched, core.StateSucceeded, "test", 0}))
	if n := b.s.Client().Exists(ctx, k.LegacyHistory("old1")).Val(); n != 0 {
		t.Fatal("the old list survived the move into the record")
	}

	// A SUCCEEDED job that is downgraded; its old list is longer than the
	// bound.
	var long []string
	var all []wantEntry
	for i := 0; i < store.HistoryHead+store.HistoryTail+50; i++ {
		reason := "r" + strconv.Itoa(i)
		long = append(long, entry(core.StateScheduled, core.StateScheduled, reason))
		all = append(all, wantEntry{core.StateScheduled, core.StateScheduled, core.Reason(reason), 0})
	}
	long = append(long, entry(core.StateScheduled, core.StateSucceeded, "done"))
	all = append(all, wantEntry{core.StateScheduled, core.StateSucceeded, "done", 0})
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
	all = append(all, wantEntry{core.StateSucceeded, core.StateOutputQuarantined, core.ReasonOutputQuarantined, 0})
	checkHistory(t, rec.History, bounded(all))
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
	want := []wantEntry{{"", core.StatePending, core.ReasonSubmitted, 0}, {core.StatePending, core.StateScheduled, "test", 0},
		{core.StateScheduled, core.StateDispatched, core.ReasonDispatched, 0}}
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
	checkHistory(t, rec.History, append(want, wantEntry{core.StateDispatched, core.StateSucceeded, "test", 0}))
	if n := b.s.Client().Exists(ctx, k.LegacyHistory("mixed")).Val(); n != 0 {
		t.Fatal("the list survived the write that moved it")
	}
	for _, f := range []string{store.HistoryField, "hn", "hu"} {
		if _, ok := rec.Fields[f]; ok {
			t.Fatalf("Fields holds the history's %s", f)
		}
	}
}
