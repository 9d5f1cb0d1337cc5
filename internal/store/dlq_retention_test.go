package store_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// TrimDLQ drops the entries written before a time and keeps the later
// ones, and the byte count the budget reads still adds up.
func TestTrimDLQDropsEntriesWrittenBefore(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	s := store.New(env.Client, store.Config{Prefix: env.KeyPrefix(), DLQRetention: time.Hour})
	if s.DLQRetention() != time.Hour {
		t.Fatalf("DLQRetention %s, want the configured 1h", s.DLQRetention())
	}
	ctx := context.Background()
	add := func(id string) {
		if err := s.AddDLQ(ctx, &store.DLQEntry{JobID: id, Reason: jobstate.ReasonDecodeFailed, Message: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	add("old-1")
	add("old-2")
	// Stream ids carry milliseconds: the cut needs a later one.
	es, err := s.ListDLQ(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := strconv.ParseInt(strings.Split(es[0].ID, "-")[0], 10, 64)
	if err != nil {
		t.Fatalf("stream id %q: %v", es[0].ID, err)
	}
	cut := time.UnixMilli(ms + 1)
	for time.Now().Before(cut.Add(time.Millisecond)) {
		time.Sleep(time.Millisecond)
	}
	add("new-1")
	n, err := s.TrimDLQ(ctx, cut)
	if err != nil || n != 2 {
		t.Fatalf("TrimDLQ dropped %d (%v), want the 2 written before the cut", n, err)
	}
	if es, err = s.ListDLQ(ctx, 10); err != nil || len(es) != 1 || es[0].JobID != "new-1" {
		t.Fatalf("left %+v (%v), want only new-1", es, err)
	}
	held, _ := dlqBytes(t, env, s)
	if got, err := s.DLQBytes(ctx); err != nil || got < held/2 || got > held*2 {
		t.Fatalf("DLQBytes %d (%v); Redis holds about %d", got, err, held)
	}
}
