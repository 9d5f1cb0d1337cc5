package troupe_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/schedule"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/worker"
)

// Tests of waits left alone (issue 31): a parked retry wait or an approval
// has no actor and no worker, so when Redis loses its data nothing is owed
// to it — its node, which indexed it, wakes it and it ends state_lost,
// dead-lettered, its client told once. Each runs on a private redis-server
// the test flushes (FLUSHALL: the loss), with the shared NATS.

// privateRedisFixture is newFixture on a redis-server of the test's own.
func privateRedisFixture(t *testing.T, mutate func(*troupe.Config)) *fixture {
	t.Helper()
	env := testenv.New(t)
	addr := startRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	env.RedisURL, env.Redis, env.Client = "redis://"+addr, rdb, rdb
	return newFixtureIn(t, env, mutate)
}

// lostFast: the lease, and the epoch check, every 0.5 s; the sweep waits a
// lock TTL (1.5 s).
func lostFast(c *troupe.Config) { c.Tuning.LockTTL = 1500 * time.Millisecond }

// toldOf collects what the client of job id hears on the result subject
// from Troupe itself (no worker id).
func toldOf(t *testing.T, f *fixture, id string) <-chan *capv1.JobResult {
	t.Helper()
	told := make(chan *capv1.JobResult, 10)
	sub, err := f.env.NATS.Subscribe(f.subj.Result, func(m *nats.Msg) {
		if p, err := bus.Decode(m.Data); err == nil && p.GetJobResult().GetJobId() == id && p.GetJobResult().GetWorkerId() == "" {
			told <- p.GetJobResult()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return told
}

// flushAndWaitLoss empties the private Redis and waits until every node saw
// the loss.
func flushAndWaitLoss(t *testing.T, f *fixture, nodes ...*troupe.Node) {
	t.Helper()
	if err := f.env.Redis.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		waitCounter(t, n, "troupe_redis_data_loss_total", "", 1)
	}
}

// endsStateLostOnce waits for the client's state_lost tell and the job's
// one state_lost DLQ entry, then checks nothing more came: no second tell,
// no second entry, once the node's sweep is done (troupe_lost_waits_woken_total).
func endsStateLostOnce(t *testing.T, f *fixture, id string, told <-chan *capv1.JobResult, nodes ...*troupe.Node) {
	t.Helper()
	select {
	case r := <-told:
		if r.Status != capv1.JobStatus_JOB_STATUS_FAILED || r.ErrorCode != string(jobstate.ReasonStateLost) {
			t.Fatalf("told %v %q, want FAILED state_lost", r.Status, r.ErrorCode)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the client was never told its waiting job's record was lost")
	}
	f.waitDLQReason(id, jobstate.ReasonStateLost)
	woken := 0.0
	for _, n := range nodes {
		waitCounter(t, n, "troupe_lost_wait_sweeps_total", "", 1)
		woken += counter(t, n, "troupe_lost_waits_woken_total", "")
	}
	if woken != 1 {
		t.Fatalf("%v lost waits woken across %d nodes, want 1", woken, len(nodes))
	}
	// The tell follows its DLQ entry; a round trip through the server
	// orders after it.
	_ = f.env.NATS.Flush()
	select {
	case r := <-told:
		t.Fatalf("told again: %v %q", r.Status, r.ErrorCode)
	default:
	}
	if n := dlqEntriesFor(t, f, id); n != 1 {
		t.Fatalf("%d DLQ entries for the job, want 1", n)
	}
}

// lossWakesNothing flushes the node's Redis, waits for its sweep, and
// checks it woke no wait and the client (told) heard nothing (what: the
// failure's words).
func lossWakesNothing(t *testing.T, f *fixture, told <-chan *capv1.JobResult, what string) {
	t.Helper()
	flushAndWaitLoss(t, f, f.node)
	waitCounter(t, f.node, "troupe_lost_wait_sweeps_total", "", 1)
	if n := counter(t, f.node, "troupe_lost_waits_woken_total", ""); n != 0 {
		t.Fatalf("%v lost waits woken, want 0", n)
	}
	_ = f.env.NATS.Flush()
	select {
	case r := <-told:
		t.Fatalf("%s: %v %q", what, r.Status, r.ErrorCode)
	default:
	}
}

// dlqEntriesFor counts the DLQ entries of job id (among the newest 100).
func dlqEntriesFor(t *testing.T, f *fixture, id string) int {
	t.Helper()
	es, err := f.node.Store().ListDLQ(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range es {
		if e.JobID == id {
			n++
		}
	}
	return n
}

// A retry wait parked (no actor, no lock: its due entry its only wake
// source) whose record Redis loses ends state_lost — dead-lettered once,
// its client told once — on two replicas, and its second attempt is never
// dispatched. On the base nothing ends it: no event is owed to it.
func TestRetryPolicyParkedWaitWhoseRecordRedisLostEndsStateLost(t *testing.T) {
	t.Parallel()
	fast := func(c *troupe.Config) { parkRetries(c); lostFast(c) }
	f := privateRedisFixture(t, fast)
	a := f.node
	b := newNodeOn(t, f, "node-b", fast)
	f.node = a
	const id = "job-retry-lost-1"
	told := toldOf(t, f, id)
	h := &flaky{fails: 1, seen: map[string][]string{}}
	rec := newReceipts()
	f.startWorker("w-flaky", true, rec, h.handle)
	f.submit(longRetryReq(id, time.Minute))
	// Parked by whichever node took it: SCHEDULED retry_wait for attempt
	// 2, no lock, no actor live on either, one wait indexed.
	lockKey := a.Store().Keys().Lock(id)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r, err := a.Record(context.Background(), id)
		la, _ := a.LiveJobActors()
		lb, _ := b.LiveJobActors()
		alone := counter(t, a, "troupe_waits_alone", "") + counter(t, b, "troupe_waits_alone", "")
		if err == nil && r.Reason == jobstate.ReasonRetryWait && r.Fields[jobstate.FieldTry] == "2" &&
			f.env.Redis.Exists(context.Background(), lockKey).Val() == 0 && la+lb == 0 && alone == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the retry wait never parked: %+v %v; %d+%d actors, %v indexed", r, err, la, lb, alone)
		}
	}

	// Attempt 1's result has left the result stream (its copy is settled
	// once the record shows it handled): no event of the job is left
	// anywhere to find the loss.
	waitNoPending(t, f.js, bus.StreamName(f.env.StreamPrefix(), bus.StreamResult), bus.ConsumerName(bus.StreamResult))
	flushAndWaitLoss(t, f, a, b)
	endsStateLostOnce(t, f, id, told, a, b)
	if n := rec.count(id + jobstate.AttemptSep + "a2"); n != 0 {
		t.Fatalf("attempt 2 dispatched %d times after its record was lost", n)
	}
}

// An approval wait (passivated: no actor, no lock) whose record Redis
// loses ends state_lost, its client told once. On the base it waits for a
// decision that can never find it.
func TestApprovalWaitWhoseRecordRedisLostEndsStateLost(t *testing.T) {
	t.Parallel()
	f := privateRedisFixture(t, func(c *troupe.Config) { c.Policy = labelPolicy{}; lostFast(c) })
	const id = "job-approval-lost"
	told := toldOf(t, f, id)
	req := echoReq(id)
	req.Labels = map[string]string{"cordum.policy": "approve"}
	f.submit(req)
	f.waitState(id, jobstate.StateApprovalRequired)
	waitCounter(t, f.node, "troupe_waits_alone", "", 1)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, _ := f.node.LiveJobActors(); n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the approval wait never passivated")
		}
	}

	flushAndWaitLoss(t, f, f.node)
	endsStateLostOnce(t, f, id, told, f.node)
	if n := counter(t, f.node, "troupe_waits_alone", ""); n != 0 {
		t.Fatalf("%v waits still indexed after the sweep", n)
	}
}

// A retry wait that parked and then ended (woken at its time on the node
// that parked it, succeeded) leaves the index when its actor takes the lock
// again: a loss after it wakes nothing, and its client hears only its
// success.
func TestRetryPolicyParkedWaitThatEndedIsNotWokenByALaterLoss(t *testing.T) {
	t.Parallel()
	f := privateRedisFixture(t, func(c *troupe.Config) { parkRetries(c); lostFast(c) })
	const id = "job-retry-ended"
	told := toldOf(t, f, id)
	h := &flaky{fails: 1, seen: map[string][]string{}}
	rec := newReceipts()
	f.startWorker("w-flaky", true, rec, h.handle)
	f.submit(longRetryReq(id, time.Second))
	f.waitRetryParked(f.node, id)
	waitCounter(t, f.node, "troupe_waits_alone", "", 1)
	f.waitStateWithin(id, jobstate.StateSucceeded, 20*time.Second)
	if n := counter(t, f.node, "troupe_waits_alone", ""); n != 0 {
		t.Fatalf("%v waits indexed after the job ended", n)
	}
	select {
	case r := <-told:
		if r.Status != capv1.JobStatus_JOB_STATUS_SUCCEEDED {
			t.Fatalf("told %v %q, want SUCCEEDED", r.Status, r.ErrorCode)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the client never heard the job's success")
	}

	lossWakesNothing(t, f, told, "told again after the loss")
}

// A job parked for its rate limit's tokens (its lock held through the node
// lease, its ask kept by the limiter: no actor, no worker) whose record
// Redis loses ends state_lost, its client told once, and never runs. On
// the base it stays in the limiter's queue for a day's refill and then
// finds no record: a plain wake, nothing recorded.
func TestLostRecordOfARateLimitedParkEndsStateLost(t *testing.T) {
	t.Parallel()
	e, _ := policyEngine(t, policyAPI24h)
	f := privateRedisFixture(t, func(c *troupe.Config) {
		c.Policy, c.NodeID = e, rateNodeID(t)
		parkSoon(c)
		lostFast(c)
	})
	rec := newReceipts()
	f.startWorker("w-rate", true, rec, worker.Echo)
	f.submit(rateReq("rate-lost-first"))
	f.waitState("rate-lost-first", jobstate.StateSucceeded)
	const id = "rate-lost-waits"
	told := toldOf(t, f, id)
	f.submit(rateReq(id))
	f.waitWaited(id)
	waitParked(t, f.node, 1)
	waitCounter(t, f.node, "troupe_waits_alone", "", 1)

	flushAndWaitLoss(t, f, f.node)
	endsStateLostOnce(t, f, id, told, f.node)
	if n := rec.count(id); n != 0 {
		t.Fatalf("the rate-limited job reached a worker %d times after its record was lost", n)
	}
}

// An approval wait two replicas both have indexed (a replica keeps its
// entry for a job another replica then woke and parked again, until its
// verify or its due time) is woken by one of them after the loss: one
// DLQ entry, one tell (without the claim of its wake, each node woke it
// and each wrote a DLQ entry).
func TestApprovalWaitIndexedByTwoReplicasIsWokenOnceAfterALoss(t *testing.T) {
	t.Parallel()
	mutate := func(c *troupe.Config) { c.Policy = labelPolicy{}; lostFast(c) }
	f := privateRedisFixture(t, mutate)
	a := f.node
	b := newNodeOn(t, f, "node-b", mutate)
	f.node = a
	const id = "job-approval-lost-twice"
	told := toldOf(t, f, id)
	req := echoReq(id)
	req.Labels = map[string]string{"cordum.policy": "approve"}
	f.submit(req)
	f.waitState(id, jobstate.StateApprovalRequired)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		la, _ := a.LiveJobActors()
		lb, _ := b.LiveJobActors()
		if counter(t, a, "troupe_waits_alone", "")+counter(t, b, "troupe_waits_alone", "") == 1 && la+lb == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the approval wait never passivated")
		}
	}
	for _, n := range []*troupe.Node{a, b} {
		if counter(t, n, "troupe_waits_alone", "") == 0 {
			n.IndexAlone(id)
		}
	}
	flushAndWaitLoss(t, f, a, b)
	endsStateLostOnce(t, f, id, told, a, b)
}

// waitAloneTotal waits until the nodes' indexes of waits left alone hold
// want entries between them.
func waitAloneTotal(t *testing.T, want float64, nodes ...*troupe.Node) {
	t.Helper()
	var got float64
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		got = 0
		for _, n := range nodes {
			got += counter(t, n, "troupe_waits_alone", "")
		}
		if got == want {
			return
		}
	}
	t.Fatalf("%v waits indexed across %d nodes, want %v", got, len(nodes), want)
}

// A delayed submit not yet due has no record: its entry in the delayed set
// is its only home. When Redis loses it, the node that held it ends it
// state_lost — dead-lettered once, its client told once — on two replicas,
// and it never runs. On the base the client waits for ever.
func TestScheduleDelayedJobWhoseEntryRedisLostEndsStateLost(t *testing.T) {
	t.Parallel()
	f := privateRedisFixture(t, lostFast)
	a := f.node
	b := newNodeOn(t, f, "node-b", lostFast)
	f.node = a
	const id = "job-delayed-lost"
	told := toldOf(t, f, id)
	rec := newReceipts()
	f.startWorker("w-delayed-lost", true, rec, worker.Echo)
	req := echoReq(id)
	req.Meta = &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAfter: "1h"}}
	f.submit(req)
	waitAloneTotal(t, 1, a, b)
	if _, err := a.Schedules().GetDelayed(context.Background(), id); err != nil {
		t.Fatalf("indexed but not held: %v", err)
	}

	flushAndWaitLoss(t, f, a, b)
	endsStateLostOnce(t, f, id, told, a, b)
	waitAloneTotal(t, 0, a, b)
	if n := rec.count(id); n != 0 {
		t.Fatalf("the lost delayed job was dispatched %d times", n)
	}
}

// A delayed submit that was cancelled, and one that came due and ran,
// leave the index once Redis shows it (out of the delayed set: cancelled,
// or with a record): a later loss wakes neither, and the cancelled one's
// client hears nothing from Troupe.
func TestScheduleDelayedJobCancelledOrSubmittedIsNotWokenByALaterLoss(t *testing.T) {
	t.Parallel()
	f := privateRedisFixture(t, lostFast)
	ctx := context.Background()
	const cancelled, ran = "job-delayed-cancelled", "job-delayed-ran"
	told := toldOf(t, f, cancelled)
	f.startWorker("w-delayed", true, nil, worker.Echo)
	for id, after := range map[string]string{cancelled: "1h", ran: "300ms"} {
		req := echoReq(id)
		req.Meta = &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAfter: after}}
		f.submit(req)
	}
	waitAloneTotal(t, 2, f.node)
	if err := f.node.Schedules().DeleteDelayed(ctx, cancelled); err != nil {
		t.Fatal(err)
	}
	f.waitState(ran, jobstate.StateSucceeded)
	waitAloneTotal(t, 0, f.node)

	lossWakesNothing(t, f, told, "the cancelled delayed job's client was told")
	for _, id := range []string{cancelled, ran} {
		if n := dlqEntriesFor(t, f, id); n != 0 {
			t.Fatalf("%d DLQ entries for %s, want 0", n, id)
		}
	}
}

// Schedules are definitions, not jobs, and Redis is their only store: a
// node keeps a copy of them (read again whenever their change count moves)
// and writes back, after a loss, those Redis no longer holds — an active
// one ticking again from where it was, a paused one paused, a deleted one
// not at all. On the base every schedule silently stops after a loss.
func TestScheduleDefinitionsRedisLostAreWrittenBack(t *testing.T) {
	t.Parallel()
	f := privateRedisFixture(t, lostFast)
	ctx := context.Background()
	f.startWorker("w-sched-lost", true, nil, worker.Echo)
	st := f.node.Schedules()
	for _, s := range []*schedule.Schedule{
		{ID: "lost-every-second", Every: "1s", Topic: "job.echo"},
		{ID: "lost-paused", Every: "1h", Topic: "job.echo", Paused: true},
		{ID: "lost-deleted", Every: "1h", Topic: "job.echo"},
	} {
		if err := st.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	waitGauge(t, f.node, "troupe_schedules_known", 3)
	if err := st.Delete(ctx, "lost-deleted"); err != nil {
		t.Fatal(err)
	}
	waitGauge(t, f.node, "troupe_schedules_known", 2)
	fired := func(after time.Time) bool {
		s, err := st.Get(ctx, "lost-every-second")
		return err == nil && s.Last != nil && s.Last.Tick.After(after)
	}
	waitCond(t, 15*time.Second, "the schedule fired before the loss", func() bool { return fired(time.Time{}) })

	flushed := time.Now()
	flushAndWaitLoss(t, f, f.node)
	waitCond(t, 15*time.Second, "the active schedule written back and ticking again", func() bool { return fired(flushed) })
	p, err := st.Get(ctx, "lost-paused")
	if err != nil || !p.Paused || p.NextTick != nil {
		t.Fatalf("paused schedule after the loss: %+v %v, want it back, paused, with no next tick", p, err)
	}
	if _, err := st.Get(ctx, "lost-deleted"); err == nil {
		t.Fatal("a schedule deleted before the loss was written back")
	}
	if n := counter(t, f.node, "troupe_schedules_restored_total", ""); n != 2 {
		t.Fatalf("%v schedules restored, want 2", n)
	}
}

// waitGauge waits until the node's gauge reads want.
func waitGauge(t *testing.T, n *troupe.Node, name string, want float64) {
	t.Helper()
	waitCond(t, 15*time.Second, name, func() bool { return counter(t, n, name, "") == want })
}

// waitCond polls cond (bounded by within) and fails naming what never came.
func waitCond(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}
