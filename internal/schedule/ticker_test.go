package schedule_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/schedule"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
)

// rig is a test's schedule store, a submit stream of its own and a record
// of every submit the tickers made (before JetStream's duplicate window).
type rig struct {
	t       *testing.T
	env     *testenv.Env
	js      jetstream.JetStream
	stream  jetstream.Stream
	subject string
	store   *schedule.Store

	mu        sync.Mutex
	submitted map[string]int // job id → submits
}

func newRig(t *testing.T) *rig {
	e := testenv.New(t)
	js, err := jetstream.New(e.NATS)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, env: e, js: js, subject: e.Prefix + ".sys.job.submit", submitted: map[string]int{},
		store: schedule.NewStore(e.Client, e.KeyPrefix())}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.stream, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: e.StreamPrefix() + "_SUBMIT",
		Subjects: []string{r.subject}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// submit is a ticker's Submit: it counts, then publishes each job with no
// Nats-Msg-Id, so the stream holds every submit.
func (r *rig) submit(ctx context.Context, jobs []schedule.Job) error {
	r.mu.Lock()
	for _, j := range jobs {
		r.submitted[j.Req.JobId]++
	}
	r.mu.Unlock()
	// As the node does (submitScheduled): every publish in flight, then
	// every ack.
	acks := make([]jetstream.PubAckFuture, 0, len(jobs))
	for _, j := range jobs {
		data, err := proto.Marshal(&capv1.BusPacket{TraceId: j.Trace, Payload: &capv1.BusPacket_JobRequest{JobRequest: j.Req}})
		if err != nil {
			return err
		}
		f, err := r.js.PublishAsync(r.subject, data)
		if err != nil {
			return err
		}
		acks = append(acks, f)
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (r *rig) ticker(now func() time.Time) *schedule.Ticker {
	return schedule.NewTicker(schedule.Config{Store: r.store, Submit: r.submit, Now: now, Poll: 100 * time.Millisecond})
}

func (r *rig) counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps(r.submitted)
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// stored is one submit as the stream holds it (labels: its labels and
// meta.labels together).
type stored struct {
	jobID  string
	labels map[string]string
	at     time.Time // the stream's stored time
}

// read returns the stream's messages once it holds want of them (at most
// 30 s).
func (r *rig) read(want int) []stored {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		info, err := r.stream.Info(ctx)
		if err != nil {
			r.t.Fatal(err)
		}
		if int(info.State.Msgs) >= want {
			break
		}
		select {
		case <-ctx.Done():
			r.t.Fatalf("stream holds %d submits, want %d", info.State.Msgs, want)
		case <-time.After(20 * time.Millisecond):
		}
	}
	var out []stored
	for seq := uint64(1); ; seq++ {
		m, err := r.stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			r.t.Fatal(err)
		}
		pkt := &capv1.BusPacket{}
		if err := proto.Unmarshal(m.Data, pkt); err != nil {
			r.t.Fatal(err)
		}
		req := pkt.GetJobRequest()
		labels := map[string]string{}
		for _, from := range []map[string]string{req.Labels, req.GetMeta().GetLabels()} {
			for k, v := range from {
				labels[k] = v
			}
		}
		out = append(out, stored{jobID: req.JobId, labels: labels, at: m.Time})
	}
}

// clock is a test's shared virtual clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

func TestScheduleIntervalOneJobPerTickAcrossReplicas(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	created := time.Now().UTC().Truncate(time.Second)
	s := &schedule.Schedule{ID: "every-minute", Every: "1m", Topic: "job.test", Tenant: "acme", CreatedAt: created}
	if err := r.store.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	clk := &clock{now: created}
	a, b := r.ticker(clk.Now), r.ticker(clk.Now)
	const ticks = 20
	for i := 1; i <= ticks; i++ {
		clk.Set(created.Add(time.Duration(i)*time.Minute + time.Duration(i)*time.Millisecond))
		// Both replicas' passes race, each several times.
		var wg sync.WaitGroup
		errs := make(chan error, 6)
		for _, tk := range []*schedule.Ticker{a, b, a, b, a, b} {
			wg.Add(1)
			go func(tk *schedule.Ticker) {
				defer wg.Done()
				_, _, err := tk.RunOnce(ctx)
				errs <- err
			}(tk)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	got := r.counts()
	if len(got) != ticks {
		t.Fatalf("%d jobs submitted, want %d (one per tick): %v", len(got), ticks, got)
	}
	for i := 1; i <= ticks; i++ {
		id := schedule.TickJobID(s.ID, created.Add(time.Duration(i)*time.Minute))
		if got[id] != 1 {
			t.Errorf("tick %d (%s): submitted %d times, want 1", i, id, got[id])
		}
	}
	msgs := r.read(ticks)
	if len(msgs) != ticks {
		t.Fatalf("stream holds %d submits, want %d", len(msgs), ticks)
	}
	for _, m := range msgs {
		if m.labels[schedule.LabelSchedule] != s.ID || m.labels[schedule.LabelTick] == "" {
			t.Errorf("%s: labels %v, want the schedule and tick", m.jobID, m.labels)
		}
	}
	back, err := r.store.Get(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := created.Add((ticks + 1) * time.Minute); back.NextTick == nil || !back.NextTick.Equal(want) {
		t.Errorf("next tick %v, want %s", back.NextTick, want)
	}
	if back.Last == nil || back.Last.JobID != schedule.TickJobID(s.ID, created.Add(ticks*time.Minute)) {
		t.Errorf("last fired %+v, want tick %d", back.Last, ticks)
	}
}

// Two replicas' tickers running their own loops on the real clock: each
// one-second tick is submitted once, at or after its time.
func TestScheduleTickersRacingOnTheClock(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	s := &schedule.Schedule{ID: "every-second", Every: "1s", Topic: "job.test"}
	if err := r.store.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	a, b := r.ticker(nil), r.ticker(nil)
	for _, tk := range []*schedule.Ticker{a, b} {
		if err := tk.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	const ticks = 3
	msgs := r.read(ticks)
	for _, tk := range []*schedule.Ticker{a, b} {
		if err := tk.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	msgs = r.read(ticks) // what the stream holds once both have stopped
	seen := map[string]bool{}
	for _, m := range msgs {
		if seen[m.jobID] {
			t.Errorf("tick job %s submitted twice", m.jobID)
		}
		seen[m.jobID] = true
		tick, err := time.Parse(time.RFC3339Nano, m.labels[schedule.LabelTick])
		if err != nil {
			t.Fatal(err)
		}
		if m.at.Before(tick) {
			t.Errorf("tick %s stored at %s, before its time", tick, m.at)
		}
	}
}

func TestSchedulePauseResumeDelete(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	created := time.Now().UTC().Truncate(time.Second)
	s := &schedule.Schedule{ID: "nightly", Cron: "0 3 * * *", Topic: "job.test", CreatedAt: created}
	if err := r.store.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := r.store.Create(ctx, &schedule.Schedule{ID: "nightly", Every: "1h", Topic: "job.x"}); !errors.Is(err, schedule.ErrExists) {
		t.Fatalf("second create: %v, want ErrExists", err)
	}
	if err := r.store.Create(ctx, &schedule.Schedule{ID: "bad", Cron: "61 * * * *", Topic: "job.x"}); !errors.Is(err, schedule.ErrSpec) {
		t.Fatalf("bad cron: %v, want ErrSpec", err)
	}
	first, _ := schedule.ParseCron("0 3 * * *", nil)
	tick1 := first.Next(time.Now())
	clk := &clock{now: tick1.Add(time.Second)}
	tk := r.ticker(clk.Now)
	if err := r.store.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	got, _ := r.store.Get(ctx, s.ID)
	if !got.Paused || got.NextTick != nil {
		t.Fatalf("paused: %+v, want paused with no next tick", got)
	}
	if _, _, err := tk.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(r.counts()); n != 0 {
		t.Fatalf("paused schedule submitted %d jobs", n)
	}
	if err := r.store.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	got, _ = r.store.Get(ctx, s.ID)
	if got.Paused || got.NextTick == nil || !got.NextTick.Equal(tick1) {
		t.Fatalf("resumed: %+v, want next tick %s", got, tick1)
	}
	if _, _, err := tk.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if c := r.counts(); len(c) != 1 || c[schedule.TickJobID(s.ID, tick1)] != 1 {
		t.Fatalf("resumed schedule submitted %v, want its tick at %s once", c, tick1)
	}
	list, err := r.store.List(ctx, "")
	if err != nil || len(list) != 1 || list[0].ID != s.ID {
		t.Fatalf("list: %v %v", list, err)
	}
	if err := r.store.Delete(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.Get(ctx, s.ID); !errors.Is(err, schedule.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if err := r.store.Delete(ctx, s.ID); !errors.Is(err, schedule.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	clk.Set(tick1.Add(24*time.Hour + time.Second))
	if _, _, err := tk.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(r.counts()); n != 1 {
		t.Fatalf("deleted schedule submitted again: %v", r.counts())
	}
}

// The tickers are stopped for K ticks; the next pass fires per policy:
// skip fires the current tick only, catch_up N fires the N most recent
// missed ticks and the current one.
func TestScheduleMissedTicksSkipVsCatchUp(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	created := time.Now().UTC().Truncate(time.Second)
	const K = 7
	skip := &schedule.Schedule{ID: "skip", Every: "1m", Topic: "job.test", Grace: "10s", CreatedAt: created}
	catch := &schedule.Schedule{ID: "catch", Every: "1m", Topic: "job.test", Grace: "10s", Missed: schedule.MissedCatchUp,
		CatchUp: 3, CreatedAt: created}
	for _, s := range []*schedule.Schedule{skip, catch} {
		if err := r.store.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	// No ticker ran for ticks 1..K-1; the pass comes 5 s after tick K.
	clk := &clock{now: created.Add(K*time.Minute + 5*time.Second)}
	if _, _, err := r.ticker(clk.Now).RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	tick := func(s *schedule.Schedule, i int) string {
		return schedule.TickJobID(s.ID, created.Add(time.Duration(i)*time.Minute))
	}
	want := map[string]int{tick(skip, K): 1, tick(catch, K-3): 1, tick(catch, K-2): 1, tick(catch, K-1): 1, tick(catch, K): 1}
	if got := r.counts(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("submitted %v, want %v", got, want)
	}
	// Catch-up ticks go first, oldest first, then the current one.
	var order []string
	for _, m := range r.read(len(want)) {
		if m.labels[schedule.LabelSchedule] == catch.ID {
			order = append(order, m.jobID)
		}
	}
	if wantOrder := []string{tick(catch, K-3), tick(catch, K-2), tick(catch, K-1), tick(catch, K)}; !slices.Equal(order, wantOrder) {
		t.Errorf("catch-up order %v, want %v", order, wantOrder)
	}
	for _, s := range []*schedule.Schedule{skip, catch} {
		got, _ := r.store.Get(ctx, s.ID)
		if want := created.Add((K + 1) * time.Minute); got.NextTick == nil || !got.NextTick.Equal(want) {
			t.Errorf("%s: next tick %v, want %s", s.ID, got.NextTick, want)
		}
	}
	// The plan itself, for a cron schedule, past its grace entirely.
	cr := &schedule.Schedule{ID: "c", Cron: "*/5 * * * *", Topic: "t", Missed: schedule.MissedCatchUp, CatchUp: 2}
	if err := cr.Validate(); err != nil {
		t.Fatal(err)
	}
	spec, _ := cr.Spec()
	base := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	p := schedule.PlanTicks(cr, spec, base, base.Add(time.Hour+3*time.Minute)) // ticks 10:00..11:00 all missed (grace 1 min)
	if len(p.Fire) != 2 || !p.Fire[0].Equal(base.Add(55*time.Minute)) || !p.Fire[1].Equal(base.Add(time.Hour)) ||
		p.Dropped != 11 || !p.Next.Equal(base.Add(65*time.Minute)) {
		t.Errorf("cron plan %+v, want 10:55 and 11:00 fired, 11 dropped, next 11:05", p)
	}
}

// Delayed jobs held through the intake's hook (Divert) are submitted in
// due order, none before its time by the stream's stored time.
func TestScheduleDelayedJobSubmittedAtItsTime(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	tk := r.ticker(nil)
	now := time.Now()
	// Held in reverse order of their due times; one in the past runs at once.
	type job struct {
		id     string
		labels map[string]string
	}
	jobs := []job{
		{"d3", map[string]string{schedule.LabelRunAfter: "900ms", "k": "v"}},
		{"d2", map[string]string{schedule.LabelRunAt: now.Add(600 * time.Millisecond).Format(time.RFC3339Nano)}},
		{"d1", map[string]string{schedule.LabelRunAt: fmt.Sprint(now.Add(300 * time.Millisecond).UnixMilli())}},
	}
	due := map[string]time.Time{}
	for _, j := range jobs {
		req := &capv1.JobRequest{JobId: j.id, Topic: "job.test", Labels: j.labels}
		held, bad, err := tk.Divert(req, "trace-"+j.id, now)
		if err != nil || bad != "" || !held {
			t.Fatalf("%s: held %v bad %q err %v", j.id, held, bad, err)
		}
		d, err := r.store.GetDelayed(ctx, j.id)
		if err != nil {
			t.Fatal(err)
		}
		due[j.id] = d.Due
	}
	for _, c := range []map[string]string{
		{schedule.LabelRunAt: now.Add(-time.Second).Format(time.RFC3339)}, // past: not held
		{"other": "label"},
	} {
		if held, bad, err := tk.Divert(&capv1.JobRequest{JobId: "now", Topic: "t", Labels: c}, "", now); held || bad != "" || err != nil {
			t.Errorf("labels %v: held %v bad %q err %v, want neither", c, held, bad, err)
		}
	}
	for _, c := range []map[string]string{
		{schedule.LabelRunAt: "tomorrow"}, {schedule.LabelRunAfter: "-1s"},
		{schedule.LabelRunAfter: "1s", schedule.LabelRunAt: "1"}, {schedule.LabelRunAfter: "9000h"},
	} {
		if held, bad, _ := tk.Divert(&capv1.JobRequest{JobId: "bad", Topic: "t", Labels: c}, "", now); held || bad == "" {
			t.Errorf("labels %v: held %v bad %q, want refused", c, held, bad)
		}
	}
	listed, err := r.store.ListDelayed(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 3 {
		t.Fatalf("listed %d delayed, want 3 before they run: %+v", len(listed), listed)
	}
	// Started after the listing: on a loaded host the first due time may
	// pass before it.
	if err := tk.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer tk.Stop(ctx)
	msgs := r.read(3)
	var order []string
	for _, m := range msgs {
		order = append(order, m.jobID)
		if m.at.Before(due[m.jobID]) {
			t.Errorf("%s stored at %s, before its due time %s", m.jobID, m.at.Format(time.RFC3339Nano), due[m.jobID].Format(time.RFC3339Nano))
		}
		if m.labels[schedule.LabelDelayedUntil] == "" || m.labels[schedule.LabelRunAt] != "" || m.labels[schedule.LabelRunAfter] != "" {
			t.Errorf("%s: labels %v, want delayed_until in place of run_at / run_after", m.jobID, m.labels)
		}
	}
	if !slices.Equal(order, []string{"d1", "d2", "d3"}) {
		t.Errorf("submitted in order %v, want d1 d2 d3", order)
	}
	if msgs[2].labels["k"] != "v" {
		t.Errorf("d3 lost its own label: %v", msgs[2].labels)
	}
	if left, _ := r.store.ListDelayed(ctx, "", 10); len(left) != 0 {
		t.Errorf("still delayed after submit: %+v", left)
	}
	// A delayed job deleted before its time is never submitted.
	late := &capv1.JobRequest{JobId: "gone", Topic: "t", Labels: map[string]string{schedule.LabelRunAfter: "1h"}}
	if held, _, err := tk.Divert(late, "", time.Now()); !held || err != nil {
		t.Fatal(held, err)
	}
	if err := r.store.DeleteDelayed(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.GetDelayed(ctx, "gone"); !errors.Is(err, schedule.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

// A replica that claims a tick, or takes delayed jobs, and never submits
// them (it died) leaves them to another replica once its lease ends.
func TestScheduleWorkOfADeadReplicaIsTakenOverAfterItsLease(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	created := time.Now().UTC().Truncate(time.Second)
	s := &schedule.Schedule{ID: "hourly", Every: "1h", Topic: "job.test", CreatedAt: created}
	if err := r.store.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	clk := &clock{now: created.Add(time.Hour + time.Second)}
	dead := schedule.NewTicker(schedule.Config{Store: r.store, Now: clk.Now, Lease: 300 * time.Millisecond,
		Submit: func(context.Context, []schedule.Job) error { return errors.New("died") }})
	late := &capv1.JobRequest{JobId: "late-1", Topic: "job.test",
		Meta: &capv1.JobMetadata{Labels: map[string]string{schedule.LabelRunAt: created.Add(time.Hour).Format(time.RFC3339)}}}
	if held, _, err := dead.Divert(late, "", created); !held || err != nil {
		t.Fatal(held, err)
	}
	if _, _, err := dead.RunOnce(ctx); err == nil {
		t.Fatal("the dying replica's pass did not fail")
	}
	live := r.ticker(clk.Now)
	// At once: the delayed job is leased and the tick claimed by the dead one.
	if _, _, err := live.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(r.counts()); n != 0 {
		t.Fatalf("submitted %v while the dead replica's leases last", r.counts())
	}
	tick := schedule.TickJobID(s.ID, created.Add(time.Hour))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		clk.Set(clk.Now().Add(50 * time.Millisecond)) // the delayed job's lease is on the tickers' clock
		if _, _, err := live.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		c := r.counts()
		if c[tick] == 1 && c["late-1"] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the leases: submitted %v, want %s and late-1 once", c, tick)
		}
	}
}
