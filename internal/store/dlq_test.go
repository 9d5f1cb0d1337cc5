package store_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// dlqBytes sums the field names and values of every DLQ entry as Redis
// holds them.
func dlqBytes(t *testing.T, env *testenv.Env, s *store.Store) (int64, []string) {
	t.Helper()
	msgs, err := env.Client.XRange(context.Background(), s.Keys().DLQ(), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	var jobs []string
	for _, m := range msgs {
		for k, v := range m.Values {
			n += int64(len(k) + len(fmt.Sprint(v)))
		}
		jobs = append(jobs, fmt.Sprint(m.Values["job_id"]))
	}
	return n, jobs
}

// The DLQ is bounded in bytes: once its budget is spent, each new entry
// pushes the oldest out, and what is left is the newest entries, in order.
func TestDLQByteBudgetTrimsOldest(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	const budget = 64 << 10
	s := store.New(env.Client, store.Config{Prefix: env.KeyPrefix(), DLQMaxBytes: budget})
	ctx := context.Background()
	const n = 100
	for i := 0; i < n; i++ {
		e := &store.DLQEntry{JobID: fmt.Sprintf("e-%03d", i), Reason: jobstate.ReasonDecodeFailed, Subject: "x",
			Message: "packet does not decode", Raw: bytes.Repeat([]byte{byte(i)}, 4000)}
		if err := s.AddDLQ(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	held, jobs := dlqBytes(t, env, s)
	const entryMax = 4096 + 1024 // one entry: its raw prefix and the rest
	if held > budget+entryMax {
		t.Fatalf("the DLQ holds %d bytes in %d entries; budget %d", held, len(jobs), budget)
	}
	if len(jobs) < budget/entryMax || len(jobs) >= n {
		t.Fatalf("%d entries left of %d; want the budget's worth (%d bytes held)", len(jobs), n, held)
	}
	first := n - len(jobs)
	for i, j := range jobs {
		if want := fmt.Sprintf("e-%03d", first+i); j != want {
			t.Fatalf("entry %d is %s, want %s: the oldest go first", i, j, want)
		}
	}
	got, err := s.DLQBytes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got < held/2 || got > held*2 {
		t.Fatalf("DLQBytes %d; Redis holds about %d", got, held)
	}
	t.Logf("%d entries of ~4 KiB under a %d-byte budget: the newest %d kept, %d bytes held (DLQBytes %d)",
		n, budget, len(jobs), held, got)
}
