package store_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// A job's history lives in its record: every hop of its life, from the
// scripts of three kinds that write hops (activate, transition, downgrade),
// read back in order with the state it left, its reason, the node that made
// it and its time.
func TestHistoryIsKeptInTheRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	before := time.Now().Add(-time.Second)
	r := b.do(t, &store.Op{Kind: store.OpActivate, JobID: "h1", Node: "a", Create: true, Topic: "job.x",
		Tenant: "t", Request: []byte("req"), T: &store.Transition{Path: []store.Hop{
			{To: jobstate.StateScheduled, Reason: "allowed"}, {To: jobstate.StateDispatched, Reason: "dispatched"}}}})
	if r.Status != store.ActivateCreated {
		t.Fatalf("create: %+v", r)
	}
	// Node b adopts the job (a's lock lapsed) and finishes it.
	if err := b.s.Client().Del(ctx, b.s.Keys().Lock("h1")).Err(); err != nil {
		t.Fatal(err)
	}
	if r := b.activate(t, "h1", "b", false); r.Status != store.ActivateAdopted || r.Fence != 2 {
		t.Fatalf("adoption: %+v", r)
	}
	if sr := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "h1", Node: "b", LockValue: jobstate.LockValue("b", 2),
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StateDispatched), Path: []store.Hop{
			{To: jobstate.StateRunning, Reason: "started"}, {To: jobstate.StateSucceeded, Reason: "completed"}}}}); !sr.OK() {
		t.Fatalf("finish: %+v", sr)
	}
	if sr := b.do(t, &store.Op{Kind: store.OpDowngrade, JobID: "h1", Node: "b",
		T: &store.Transition{Path: []store.Hop{{To: jobstate.StateOutputQuarantined, Reason: "output_quarantined"}}}}); !sr.OK() {
		t.Fatalf("downgrade: %+v", sr)
	}
	rec, err := b.s.GetJob(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	want := []store.HistoryEntry{
		{From: "", To: jobstate.StatePending, Reason: "submitted", Node: "a"},
		{From: jobstate.StatePending, To: jobstate.StateScheduled, Reason: "allowed", Node: "a"},
		{From: jobstate.StateScheduled, To: jobstate.StateDispatched, Reason: "dispatched", Node: "a"},
		{From: jobstate.StateDispatched, To: jobstate.StateRunning, Reason: "started", Node: "b"},
		{From: jobstate.StateRunning, To: jobstate.StateSucceeded, Reason: "completed", Node: "b"},
		{From: jobstate.StateSucceeded, To: jobstate.StateOutputQuarantined, Reason: "output_quarantined", Node: "b"},
	}
	if len(rec.History) != len(want) {
		t.Fatalf("history has %d entries, want %d: %+v", len(rec.History), len(want), rec.History)
	}
	for i, e := range rec.History {
		w := want[i]
		if e.From != w.From || e.To != w.To || e.Reason != w.Reason || e.Node != w.Node {
			t.Errorf("entry %d: %+v, want %+v", i, e, w)
		}
		if e.At.Before(before) || e.At.After(time.Now().Add(time.Second)) {
			t.Errorf("entry %d at %v, not within the test", i, e.At)
		}
		if i > 0 && e.At.Before(rec.History[i-1].At) {
			t.Errorf("entry %d at %v is before the one ahead of it (%v)", i, e.At, rec.History[i-1].At)
		}
	}
	if !rec.Updated.Equal(rec.History[len(rec.History)-1].At) {
		t.Errorf("updated %v, want the last hop's time %v", rec.Updated, rec.History[len(rec.History)-1].At)
	}
	// The hop fields stay short enough for Redis's compact hash encoding,
	// which is what makes keeping them in the record cheap (real Redis only:
	// the embedded store does not answer OBJECT ENCODING).
	if enc, err := b.s.Client().ObjectEncoding(ctx, b.s.Keys().Job("h1")).Result(); err == nil && enc != "listpack" {
		t.Errorf("the record's encoding is %q, want listpack", enc)
	}
}

// A record never changed since its create carries no "updated": it reads
// as its creation time, in the record and in the listings.
func TestUpdatedOfANewRecordIsItsCreation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.activate(t, "u1", "a", true)
	rec, err := b.s.GetJob(ctx, "u1")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := rec.Fields["updated"]; ok {
		t.Errorf("a new record has updated %q", rec.Fields["updated"])
	}
	if rec.Created.IsZero() || !rec.Updated.Equal(rec.Created) {
		t.Fatalf("created %v, updated %v", rec.Created, rec.Updated)
	}
	page, err := b.s.ListJobs(ctx, store.ListQuery{State: jobstate.StatePending})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, j := range page.Jobs {
		if j.ID == "u1" {
			found = true
			if !j.Updated.Equal(rec.Created) {
				t.Errorf("listed updated %v, want %v", j.Updated, rec.Created)
			}
		}
	}
	if !found {
		t.Error("u1 not listed as PENDING")
	}
}

// A hop written by a node whose clock is behind the creator's has a
// negative offset, and is read back as such.
func TestHistoryReadsANegativeOffset(t *testing.T) {
	h := store.History(map[string]string{"created": "1000", "hn": "2",
		"h1": "0|PENDING|submitted|a", "h2": "-7|SCHEDULED|allowed|b"})
	if len(h) != 2 || h[1].At.UnixMilli() != 993 || h[1].Node != "b" {
		t.Fatalf("history %+v", h)
	}
}

// Entries that do not parse are skipped, not read as zero values.
func TestHistorySkipsMalformedEntries(t *testing.T) {
	h := store.History(map[string]string{"created": "1000", "hn": "3",
		"h1": "0|PENDING|submitted|a", "h2": "oops", "h3": "5|SCHEDULED|allowed|"})
	if len(h) != 2 || h[1].To != jobstate.StateScheduled || h[1].From != jobstate.StatePending || h[1].Node != "a" ||
		h[1].At.UnixMilli() != 1005 {
		t.Fatalf("history %+v", h)
	}
}

// TestHistoryDatesTheTimeBeforeTheCreate: a record created after its job
// waited (fields store.FieldSubmitted and store.FieldWaited) dates its first hop at the
// submit and the SCHEDULED hop written with the create at the wait's start;
// later hops keep their own times.
func TestHistoryDatesTheTimeBeforeTheCreate(t *testing.T) {
	f := map[string]string{"created": "100000", "hn": "4", store.FieldSubmitted: "60000", store.FieldWaited: "61000",
		"h1": "0|PENDING|submitted|n1", "h2": "0|SCHEDULED|pool_overloaded|", "h3": "0|DISPATCHED|dispatched|",
		"h4": "500|SCHEDULED|worker_lost|"}
	h := store.History(f)
	want := []int64{60000, 61000, 100000, 100500}
	if len(h) != len(want) {
		t.Fatalf("history %+v", h)
	}
	for i, w := range want {
		if h[i].At.UnixMilli() != w {
			t.Fatalf("hop %d (%s %s) at %d, want %d", i+1, h[i].To, h[i].Reason, h[i].At.UnixMilli(), w)
		}
	}
}

// A new record names its creating node in its first hop only (no "hl"
// field of its own, one field fewer per job): the creator's later hops are
// still its own, and a hop by another node after them names that node.
func TestHistoryNodeOfANewRecordIsItsFirstHops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.do(t, &store.Op{Kind: store.OpActivate, JobID: "hn1", Node: "a", Create: true, Topic: "job.x",
		Tenant: "t", Request: []byte("req"), T: &store.Transition{Path: []store.Hop{
			{To: jobstate.StateScheduled, Reason: "allowed"}, {To: jobstate.StateDispatched, Reason: "dispatched"}}}})
	if r.Status != store.ActivateCreated {
		t.Fatalf("create: %+v", r)
	}
	if ok, err := b.s.Client().HExists(ctx, b.s.Keys().Job("hn1"), "hl").Result(); err != nil || ok {
		t.Fatalf("a new record has field hl (%v, %v)", ok, err)
	}
	if sr := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "hn1", Node: "a", LockValue: jobstate.LockValue("a", 1),
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StateDispatched),
			Path: []store.Hop{{To: jobstate.StateRunning, Reason: "started"}}}}); !sr.OK() {
		t.Fatalf("running: %+v", sr)
	}
	if err := b.s.Client().Del(ctx, b.s.Keys().Lock("hn1")).Err(); err != nil {
		t.Fatal(err)
	}
	if r := b.activate(t, "hn1", "b", false); r.Status != store.ActivateAdopted || r.Fence != 2 {
		t.Fatalf("adoption: %+v", r)
	}
	if sr := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "hn1", Node: "b", LockValue: jobstate.LockValue("b", 2),
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StateRunning),
			Path: []store.Hop{{To: jobstate.StateSucceeded, Reason: "completed"}}}}); !sr.OK() {
		t.Fatalf("finish: %+v", sr)
	}
	rec, err := b.s.GetJob(ctx, "hn1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a", "a", "a", "a", "b"}
	if len(rec.History) != len(want) {
		t.Fatalf("history has %d entries, want %d: %+v", len(rec.History), len(want), rec.History)
	}
	for i, e := range rec.History {
		if e.Node != want[i] {
			t.Errorf("entry %d (%s → %s) by %q, want %q", i, e.From, e.To, e.Node, want[i])
		}
	}
}

// The scripts name a record's first hops and write its hop count from
// tables of strings (lib/hops.lua); past those tables' end a hop is named
// and counted as it always was. A history longer than the tables reads
// back whole, and the record holds the count and the names as decimal
// text, as a node of the version before wrote them.
func TestHistoryPastTheScriptsNamedHopsIsKept(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if r := b.do(t, &store.Op{Kind: store.OpActivate, JobID: "long", Node: "a", Create: true, Topic: "job.x",
		Tenant: "t", Request: []byte("req"), T: &store.Transition{Path: []store.Hop{
			{To: jobstate.StateScheduled, Reason: "allowed"}, {To: jobstate.StateDispatched, Reason: "dispatched"}}}}); r.Status != store.ActivateCreated {
		t.Fatalf("create: %+v", r)
	}
	// 12 hops in one transition: the record's hops 4 to 15.
	var path []store.Hop
	for i := 0; i < 6; i++ {
		path = append(path, store.Hop{To: jobstate.StateRunning, Reason: "started"},
			store.Hop{To: jobstate.StateDispatched, Reason: "dispatched"})
	}
	if sr := b.do(t, &store.Op{Kind: store.OpTransition, JobID: "long", Node: "a", LockValue: jobstate.LockValue("a", 1),
		T: &store.Transition{Expect: jobstate.Expect(jobstate.StateDispatched), Path: path}}); !sr.OK() {
		t.Fatalf("transition: %+v", sr)
	}
	raw, err := b.s.Client().HGetAll(ctx, b.s.Keys().Job("long")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if raw["hn"] != "15" {
		t.Errorf("hn = %q, want \"15\"", raw["hn"])
	}
	for _, f := range []string{"h1", "h12", "h13", "h15"} {
		if raw[f] == "" {
			t.Errorf("field %s missing: %v", f, raw)
		}
	}
	rec, err := b.s.GetJob(ctx, "long")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.History) != 15 {
		t.Fatalf("history has %d entries, want 15: %+v", len(rec.History), rec.History)
	}
	for i, e := range rec.History[3:] {
		want := jobstate.StateRunning
		if i%2 == 1 {
			want = jobstate.StateDispatched
		}
		if e.To != want || e.Node != "a" {
			t.Errorf("entry %d: %+v, want to %s by a", i+3, e, want)
		}
	}
}

// A hop's offset from the record's created time is written as the script
// language's own tostring writes the difference, whatever "created" holds
// (lib/hops.lua formats a whole number of fewer than 15 digits as an
// integer, which is the same text): negative, a fraction, too large for
// that, or no number at all. Records written by a node of the version
// before read the same.
func TestHistoryHopOffsetIsTostringsText(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rdb, keys := b.s.Client(), b.s.Keys()
	created := []string{strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10), "1000", "-99999999999999",
		"1000.5", "abc", strconv.FormatInt(time.Now().UnixMilli()-1, 10)}
	for i, c := range created {
		id := "off-" + strconv.Itoa(i)
		if r := b.do(t, &store.Op{Kind: store.OpActivate, JobID: id, Node: "a", Create: true, Topic: "job.x",
			Tenant: "t", Request: []byte("req"), T: &store.Transition{Path: []store.Hop{
				{To: jobstate.StateScheduled, Reason: "allowed"}}}}); r.Status != store.ActivateCreated {
			t.Fatalf("create: %+v", r)
		}
		if err := rdb.HSet(ctx, keys.Job(id), "created", c).Err(); err != nil {
			t.Fatal(err)
		}
		if sr := b.do(t, &store.Op{Kind: store.OpTransition, JobID: id, Node: "a", LockValue: jobstate.LockValue("a", 1),
			T: &store.Transition{Expect: jobstate.Expect(jobstate.StateScheduled),
				Path: []store.Hop{{To: jobstate.StateDispatched, Reason: "dispatched"}}}}); !sr.OK() {
			t.Fatalf("transition: %+v", sr)
		}
		raw, err := rdb.HMGet(ctx, keys.Job(id), "h3", "updated").Result()
		if err != nil {
			t.Fatal(err)
		}
		want, err := rdb.Eval(ctx, "return tostring(tonumber(ARGV[1]) - (tonumber(ARGV[2]) or 0))", nil,
			raw[1], c).Text()
		if err != nil {
			t.Fatal(err)
		}
		if h3, _ := raw[0].(string); h3 != want+"|DISPATCHED|dispatched|" {
			t.Errorf("created %q, updated %v: hop %q, want offset %q", c, raw[1], h3, want)
		}
	}
}
