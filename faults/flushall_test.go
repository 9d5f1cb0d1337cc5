package faults_test

// Redis loses every key (FLUSHALL) under load with two nodes (issue 20,
// item 8).

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// FLUSHALL of the nodes' Redis while 300 jobs of 2 s arrive at 20/s on two
// nodes and two workers. The FLUSHALL runs in one MULTI with a read of
// every job's state, so what each job had lost is known exactly. The nodes
// notice (troupe_redis_data_loss_total); the live actors of the jobs in
// flight write their records back (state_lost); a result that finds no
// record is handed back to JetStream (troupe_unknown_job_events_held_total)
// until the owner has written it back. Every job ends within 2 minutes of
// the flush: those in flight SUCCEEDED, none runs twice.
//
// "lock_ttl_15s": the owners renew (and notice) every 5 s, before any job
// actor parks (10 s). "lock_ttl_60s" (the default TTL: every 20 s): a live
// actor parks first and finds its lock gone at the park; it activates again
// and writes the record back (before that fix it stopped, and 5–20 of 40
// such jobs ended with no record, only a state_lost DLQ entry).
func TestFaultFlushallWithTwoNodes(t *testing.T) {
	procFaultsGate(t)
	t.Run("lock_ttl_15s", func(t *testing.T) { flushall(t, 15*time.Second) })
	t.Run("lock_ttl_60s", func(t *testing.T) { flushall(t, 60*time.Second) })
}

func flushall(t *testing.T, lockTTL time.Duration) {
	const (
		jobs       = 300
		rate       = 20
		flushAfter = 100
		hold       = 2 * time.Second
		bound      = 2 * time.Minute
	)
	r := newProcRig(t, procRigOptions{lock: lockTTL, dispatch: 60 * time.Second, running: 60 * time.Second})
	for _, id := range []string{"w1", "w2"} {
		r.troupeWorker(id, "--handler", "sleep", "--sleep", hold.String(), "--max-parallel", "200",
			"--heartbeat", "500ms", "--dedupe")
	}
	r.waitWorkers(2)
	reached := make(chan struct{})
	start := time.Now()
	done := r.submitAt("fa", jobs, rate, func(i int) {
		if i == flushAfter-1 {
			close(reached)
		}
	})
	<-reached
	all := r.allIDs("fa", jobs)
	ctx := context.Background()
	var reads []*redis.StringCmd
	_, err := r.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, id := range all {
			reads = append(reads, p.HGet(ctx, r.st.Keys().Job(id), "s"))
		}
		p.FlushAll(ctx)
		return nil
	})
	if err != nil && err != redis.Nil {
		t.Fatalf("MULTI/FLUSHALL: %v", err)
	}
	flushed := time.Now()
	before := map[string]jobstate.State{}
	beforeCounts := map[string]int{}
	for i, c := range reads {
		s := jobstate.State(c.Val())
		before[all[i]] = s
		k := string(s)
		if k == "" {
			k = "no record"
		}
		beforeCounts[k]++
	}
	ids := <-done

	// A job has ended when its record is terminal, or when it has no
	// record and its result was dead-lettered; a job already terminal
	// before the flush ended then.
	dead := map[string]jobstate.Reason{}
	ended := func(id string, s jobstate.State) bool {
		switch {
		case s.Terminal():
			return true
		case s != "":
			return false
		case before[id].Terminal():
			return true
		}
		_, ok := dead[id]
		return ok
	}
	var left []string
	at := time.Now()
	for deadline := flushed.Add(bound); ; time.Sleep(200 * time.Millisecond) {
		if es, err := r.st.ListDLQ(ctx, 10_000); err == nil {
			for _, e := range es {
				dead[e.JobID] = e.Reason
			}
		}
		left = left[:0]
		for id, s := range r.states(ids) {
			if !ended(id, s) {
				left = append(left, id)
			}
		}
		at = time.Now()
		if len(left) == 0 || at.After(deadline) {
			break
		}
	}
	sort.Strings(left)
	recs := r.records(ids)
	for _, id := range left {
		if rec := recs[id]; rec != nil {
			t.Errorf("%s (before the flush: %q) still %s (%s) %v after the flush: %s", id, before[id], rec.State, rec.Reason, bound, hops(rec))
		} else {
			t.Errorf("%s (before the flush: %q): no record and no DLQ entry %v after the flush", id, before[id], bound)
		}
	}

	runs := r.runs("w1", "w2")
	outcome := map[string]int{} // "<state before> → <outcome>"
	recreated, twice, both, lostResults := 0, 0, 0, 0
	for _, id := range ids {
		rec := recs[id]
		b := string(before[id])
		if b == "" {
			b = "no record"
		}
		o := "no record"
		switch {
		case rec != nil:
			o = string(rec.State) + "/" + string(rec.Reason)
			for _, h := range rec.History {
				if h.Reason == jobstate.ReasonStateLost {
					recreated++
					break
				}
			}
		case dead[id] != "":
			o = "no record, DLQ " + string(dead[id])
		}
		outcome[b+" → "+o]++
		for w, n := range runs[id] {
			if n > 1 {
				twice++
				t.Errorf("%s: %s ran it %d times", id, w, n)
			}
		}
		if len(runs[id]) > 1 {
			both++
			t.Errorf("%s: ran on both workers (before the flush: %q): %s", id, before[id], hopsOrNone(rec))
		}
		switch {
		case before[id].Terminal():
		case rec == nil:
			// In flight at the flush (every actor was live: no job was
			// older than ParkAfter), or not yet created: its record must
			// be written back or created, not its result dead-lettered.
			t.Errorf("%s (before the flush: %q): no record at the end (DLQ %q)", id, before[id], dead[id])
		case rec.State != jobstate.StateSucceeded:
			if rec.State == jobstate.StateTimeout && dead[id] != "" {
				lostResults++ // written back, but its result dead-lettered
			}
			t.Errorf("%s (before the flush: %q): %s (%s), DLQ %q: %s", id, before[id], rec.State, rec.Reason, dead[id], hops(rec))
		}
	}
	var parts []string
	for k, n := range outcome {
		parts = append(parts, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(parts)
	var bc []string
	for k, n := range beforeCounts {
		bc = append(bc, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(bc)
	deadByReason := map[jobstate.Reason]int{}
	for _, reason := range dead {
		deadByReason[reason]++
	}
	t.Logf("FLUSHALL with 2 nodes (lock TTL %v) under %d jobs of %v at %d/s, after %d submits (%v in): states at the flush {%s}; every job ended %v after the flush (%v after the first submit)",
		lockTTL, jobs, hold, rate, flushAfter, flushed.Sub(start).Round(10*time.Millisecond), strings.Join(bc, " "),
		at.Sub(flushed).Round(10*time.Millisecond), at.Sub(start).Round(10*time.Millisecond))
	t.Logf("outcomes (state at the flush → end): %s", strings.Join(parts, "; "))
	// The nodes notice the loss at their next lock renewal (every lock
	// TTL / 3), which may come after every job has ended.
	for noticeBy := flushed.Add(lockTTL/3 + 5*time.Second); r.metric(-1, "troupe_redis_data_loss_total") < 1 &&
		time.Now().Before(noticeBy); {
		time.Sleep(100 * time.Millisecond)
	}
	held := r.metric(-1, "troupe_unknown_job_events_held_total")
	t.Logf("records written back (state_lost hops) %d; DLQ entries %v; results and cancels held for a missing record %.0f (n1 %.0f, n2 %.0f); "+
		"data loss noticed %.0f times (nodes); run twice by one worker %d, by both %d; TIMEOUT after the result was dead-lettered %d",
		recreated, deadByReason, held, r.metric(0, "troupe_unknown_job_events_held_total"), r.metric(1, "troupe_unknown_job_events_held_total"),
		r.metric(-1, "troupe_redis_data_loss_total"), twice, both, lostResults)
	if r.metric(-1, "troupe_redis_data_loss_total") < 1 {
		t.Error("no node noticed Redis lose its data")
	}
	t.Logf("results and cancels forwarded to their owner: by n1 %.0f, by n2 %.0f", r.metric(0, "troupe_events_forwarded_total"),
		r.metric(1, "troupe_events_forwarded_total"))
	if recreated == 0 {
		t.Error("no record was written back; the flush caught no job in flight")
	}
}

func hopsOrNone(rec *store.JobRecord) string {
	if rec == nil {
		return "no record"
	}
	return hops(rec)
}
