package intake

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
)

// A node whose lock renewals are late takes no submit and no result from
// its streams — its fetch loops keep asking the gate and pull nothing —
// until a renewal round has answered every live lock; then both arrive.
func TestAdmissionWaitsForLateRenewals(t *testing.T) {
	env := testenv.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	if err := st.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}

	// The node holds one live lock, and its renewer's clock is past the
	// lock's last renewal by more than LateAfter: its renewals are late.
	rn := st.NewLockRenewer(nil)
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	rn.SetClock(func() time.Time { return time.Unix(0, clock.Load()) })
	if err := env.Client.Set(ctx, st.Keys().Lock("held-1"), "n1|1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	rn.Hold("held-1", "n1|1", func(bool) { t.Error("the held lock was reported lost") })
	clock.Add(int64(rn.LateAfter() + time.Millisecond))
	if !rn.Late() {
		t.Fatal("renewer not late")
	}

	rig := startAdmissionRig(t, ctx, env, st, rn, "late-job", "late-result")

	// Every submit loop has asked the gate again and again (the second
	// starts half a fetch wait late); none took anything.
	rig.waitPolls(t)
	rig.noneTaken(t, "while the renewals were late")

	// A round renews the lock: the renewals have caught up, and both
	// messages are taken.
	rn.RenewOnce(ctx)
	if rn.Late() {
		t.Fatal("renewer still late after a round renewed every lock")
	}
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case m := <-rig.routed:
			got[m] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("taken after the renewals caught up: %v, want the submit and the result", got)
		}
	}
	if !got["submit late-job"] || !got["result late-result"] {
		t.Fatalf("taken %v", got)
	}
}

// A node holding MaxLiveLocks live locks takes no more submits — results
// still come in, since they end jobs — until one lock goes.
func TestSubmitsWaitWhileMaxLiveLocksAreHeld(t *testing.T) {
	env := testenv.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	rn := st.NewLockRenewer(nil) // not started: nothing is renewed, and nothing is late
	for i := 0; i < MaxLiveLocks; i++ {
		rn.Hold(fmt.Sprintf("live-%d", i), "n1|1", func(bool) {})
	}
	rig := startAdmissionRig(t, ctx, env, st, rn, "one-more", "ending")
	select {
	case m := <-rig.routed:
		if m != "result ending" {
			t.Fatalf("%s taken at MaxLiveLocks live locks", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the result was not taken at MaxLiveLocks live locks")
	}
	rig.waitPolls(t)
	rig.noneTaken(t, "at MaxLiveLocks live locks")
	rn.Forget("live-0", "n1|1")
	select {
	case m := <-rig.routed:
		if m != "submit one-more" {
			t.Fatalf("taken %s", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the submit was not taken once a live lock went")
	}
}

// admissionRig is an intake over real streams whose job shard reports every
// message it is routed, with a submit and a result waiting in the streams.
type admissionRig struct {
	routed chan string   // "submit <job id>" or "result <job id>", as routed
	polls  chan struct{} // one per time a submit loop asked its own hold
}

// startAdmissionRig publishes a submit of submitID and a result of
// resultID and starts the intake's fetch loops with renewer rn.
func startAdmissionRig(t *testing.T, ctx context.Context, env *testenv.Env, st *store.Store, rn *store.LockRenewer,
	submitID, resultID string) *admissionRig {
	t.Helper()
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	subj := bus.NewSubjects(env.Prefix)
	if err := bus.EnsureStreams(ctx, js, env.StreamPrefix(), subj); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &admissionRig{routed: make(chan string, 10), polls: make(chan struct{}, 1000)}
	sys := actor.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	shard := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if d, ok := c.Message().(*supervisor.Deliver); ok {
			switch m := d.Msg.(type) {
			case *jobactor.Submit:
				_ = m.Delivery.Ack()
				r.routed <- "submit " + d.JobID
			case *jobactor.Result:
				_ = m.Delivery.Ack()
				r.routed <- "result " + d.JobID
			}
		}
	}))
	in := &Intake{Store: st, Log: log, Shards: []*actor.PID{shard}, Env: &jobactor.Env{NodeID: "n1", Log: log,
		Subjects: subj, Root: sys.Root, Renewer: rn, Publish: func(string, []byte) error { return nil }}}
	req, err := bus.EncodeRequest("tr-1", "client", &capv1.JobRequest{JobId: submitID, Topic: "job.echo"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := bus.EncodeResult("tr-2", "another-node", &capv1.JobResult{JobId: resultID,
		Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subj.Submit, req); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subj.Result, res); err != nil {
		t.Fatal(err)
	}
	// The submit loops' own hold never holds; each call says a loop is
	// polling the gate.
	notHeld := func() bool {
		select {
		case r.polls <- struct{}{}:
		default:
		}
		return false
	}
	if err := in.Consume(ctx, js, env.StreamPrefix(), notHeld); err != nil {
		t.Fatal(err)
	}
	return r
}

// waitPolls waits until every submit loop has asked the gate again and
// again (the second starts half a fetch wait late).
func (r *admissionRig) waitPolls(t *testing.T) {
	t.Helper()
	for i := 0; i < 4*bus.FetchLoops+int(bus.FetchMaxWait/bus.HoldPoll); i++ {
		select {
		case <-r.polls:
		case <-time.After(10 * time.Second):
			t.Fatalf("the submit loops stopped polling after %d polls", i)
		}
	}
}

// noneTaken fails if a message was routed by now.
func (r *admissionRig) noneTaken(t *testing.T, when string) {
	t.Helper()
	select {
	case m := <-r.routed:
		t.Fatalf("%s taken %s", m, when)
	default:
	}
}

// A result heard on the result subject (the owner's fast path, which
// starts a parked job's actor) is dropped while the node's renewals are
// late, as the result stream's fetches are held then — its shared copy
// comes in through the gate — and goes to the job's shard again once a
// round has renewed every lock.
func TestHeardResultsDroppedWhileRenewalsAreLate(t *testing.T) {
	env := testenv.New(t)
	ctx := context.Background()
	st := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	if err := st.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	rn := st.NewLockRenewer(nil)
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	rn.SetClock(func() time.Time { return time.Unix(0, clock.Load()) })
	if err := env.Client.Set(ctx, st.Keys().Lock("held-1"), "n1|1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	rn.Hold("held-1", "n1|1", func(bool) { t.Error("the held lock was reported lost") })
	clock.Add(int64(rn.LateAfter() + time.Millisecond))
	if !rn.Late() {
		t.Fatal("renewer not late")
	}

	// The shard reports every job it is delivered and every marker it gets
	// (one sender's messages arrive in order).
	got := make(chan string, 10)
	sys := actor.NewActorSystem()
	t.Cleanup(sys.Shutdown)
	shard := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *supervisor.Deliver:
			got <- "deliver " + m.JobID
		case string:
			got <- m
		}
	}))
	router := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	in := &Intake{Store: st, Log: log, Shards: []*actor.PID{shard}, confirm: &confirmer{}, Env: &jobactor.Env{NodeID: "n1", Log: log,
		Subjects: bus.NewSubjects(env.Prefix), Root: sys.Root, Router: router, Renewer: rn}}
	in.confirm = &confirmer{in: in} // as startOwnResults leaves it (the settled set heard copies mark)
	res, err := bus.EncodeResult("tr-1", "w1", &capv1.JobResult{JobId: "held-1", WorkerId: "w1",
		Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED})
	if err != nil {
		t.Fatal(err)
	}
	next := func() string {
		t.Helper()
		select {
		case m := <-got:
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("the shard got nothing")
			return ""
		}
	}

	in.HandleOwnResult(&nats.Msg{Data: res})
	sys.Root.Send(shard, "marker")
	if m := next(); m != "marker" {
		t.Fatalf("while the renewals were late the shard got %q first, want the marker only", m)
	}

	rn.RenewOnce(ctx)
	if rn.Late() {
		t.Fatal("renewer still late after a round renewed every lock")
	}
	// Another replica's job (no lock held here) is dropped unread; this
	// node's own goes to its shard.
	other, err := bus.EncodeResult("tr-2", "w1", &capv1.JobResult{JobId: "other-1", WorkerId: "w1",
		Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED})
	if err != nil {
		t.Fatal(err)
	}
	in.HandleOwnResult(&nats.Msg{Data: other})
	in.HandleOwnResult(&nats.Msg{Data: res})
	if m := next(); m != "deliver held-1" {
		t.Fatalf("after the renewals caught up the shard got %q, want the held job's heard result (and not another replica's)", m)
	}
}
