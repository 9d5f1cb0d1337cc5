package store_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// A node under release load renews its locks in time: while its Writer is
// kept full (a hold's answers all arriving at once), the renewer's rounds
// still answer every live lock within the lock TTL — after two TTLs of
// load (six rounds) every lock is there, none reported lost or refused,
// and the renewer is not late. (A round may fail on a loaded host: a lock
// survives MaxRenewFailures-1 failed rounds by design; the lock TTL here
// gives each round 3 s for its 8 pipelines of 8 calls.)
//
// It floods the Redis it runs on (~60,000 ops/s for 18 s), which would slow
// every test beside it: it runs with the fault suite (make test-faults,
// TROUPE_FAULTS=1), alone on the machine.
func TestRenewerKeepsLocksWhileTheWriterIsFlooded(t *testing.T) {
	if os.Getenv("TROUPE_FAULTS") == "" {
		t.Skip("a load test: runs with make test-faults (TROUPE_FAULTS=1)")
	}
	env := testenv.New(t)
	ctx := context.Background()
	const ttl = 9 * time.Second
	s := store.New(env.Client, store.Config{Prefix: env.KeyPrefix(), LockTTL: ttl})
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	w := s.NewWriter(store.WriterConcurrencyDefault, store.WriterMaxBatchDefault, 8192)
	defer w.Close()
	rdb := s.Client()

	const n = 8000
	rn := s.NewLockRenewer(nil)
	pipe := rdb.Pipeline()
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("held-%d", i)
		pipe.Set(ctx, s.Keys().Lock(id), "a|1", ttl)
		rn.Hold(id, "a|1", func(bool) { t.Errorf("lock %s reported lost", id) })
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	rn.Start()
	defer rn.Stop()

	// The flood: releases of other jobs' locks, submitted as fast as the
	// Writer takes them (Submit waits while its queue is full).
	var done atomic.Int64
	behind := false
	until := time.Now().Add(2 * ttl)
	for i := 0; time.Now().Before(until); i++ {
		w.Submit(&store.Op{Kind: store.OpRelease, JobID: fmt.Sprintf("flood-%d", i), LockValue: "b|1",
			Done: func(*store.Result) { done.Add(1) }})
		behind = behind || w.Behind()
	}
	if !behind {
		t.Fatalf("the Writer was never behind (%d ops done): no release load", done.Load())
	}
	if rn.Late() {
		t.Fatal("renewer late under the Writer's load")
	}
	st := rn.Stats()
	if st.Lost != 0 || st.Refused != 0 {
		t.Fatalf("under the Writer's load (%d ops done): %+v, want no lock lost or refused", done.Load(), st)
	}
	// Rounds every TTL/3 over two TTLs (six rounds): at least three
	// rounds' renewals of every lock.
	if st.Renewed < 3*n {
		t.Fatalf("renewed %d over %v, want ≥ %d (three rounds)", st.Renewed, 2*ttl, 3*n)
	}
	for _, i := range []int{0, n / 3, n / 2, n - 1} {
		key := s.Keys().Lock(fmt.Sprintf("held-%d", i))
		if v, err := rdb.Get(ctx, key).Result(); err != nil || v != "a|1" {
			t.Fatalf("lock held-%d after two TTLs of load: %q, %v", i, v, err)
		}
	}
	t.Logf("%d Writer ops done under load; renewals %+v", done.Load(), st)
}
