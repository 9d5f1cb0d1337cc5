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
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	subj := bus.NewSubjects(env.Prefix)
	prefix := env.StreamPrefix()
	if err := bus.EnsureStreams(ctx, js, prefix, subj); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
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

	// The job shard: every message the intake routes arrives here.
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	routed := make(chan string, 10)
	shard := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if d, ok := c.Message().(*supervisor.Deliver); ok {
			switch m := d.Msg.(type) {
			case *jobactor.Submit:
				_ = m.Delivery.Ack()
				routed <- "submit " + d.JobID
			case *jobactor.Result:
				_ = m.Delivery.Ack()
				routed <- "result " + d.JobID
			}
		}
	}))
	in := &Intake{Store: st, Log: log, Shards: []*actor.PID{shard}, Env: &jobactor.Env{NodeID: "n1", Log: log,
		Subjects: subj, Root: sys.Root, Renewer: rn, Publish: func(string, []byte) error { return nil }}}

	// The submit loops' own hold never holds; each call says a loop is
	// polling the gate.
	polls := make(chan struct{}, 1000)
	notHeld := func() bool {
		select {
		case polls <- struct{}{}:
		default:
		}
		return false
	}
	req, err := bus.EncodeRequest("tr-1", "client", &capv1.JobRequest{JobId: "late-job", Topic: "job.echo"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := bus.EncodeResult("tr-2", "another-node", &capv1.JobResult{JobId: "late-result",
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
	if err := in.Consume(ctx, js, prefix, notHeld); err != nil {
		t.Fatal(err)
	}

	// Every submit loop has asked the gate again and again (the second
	// starts half a fetch wait late); none took anything.
	for i := 0; i < 4*bus.FetchLoops+int(bus.FetchMaxWait/bus.HoldPoll); i++ {
		select {
		case <-polls:
		case <-time.After(10 * time.Second):
			t.Fatalf("the submit loops stopped polling after %d polls", i)
		}
	}
	select {
	case m := <-routed:
		t.Fatalf("%s taken while the renewals were late", m)
	default:
	}

	// A round renews the lock: the renewals have caught up, and both
	// messages are taken.
	rn.RenewOnce(ctx)
	if rn.Late() {
		t.Fatal("renewer still late after a round renewed every lock")
	}
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case m := <-routed:
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
	js, err := jetstream.New(env.NATS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	subj := bus.NewSubjects(env.Prefix)
	prefix := env.StreamPrefix()
	if err := bus.EnsureStreams(ctx, js, prefix, subj); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	st := store.New(env.Client, store.Config{Prefix: env.KeyPrefix()})
	rn := st.NewLockRenewer(nil) // not started: nothing is renewed, and nothing is late
	for i := 0; i < MaxLiveLocks; i++ {
		rn.Hold(fmt.Sprintf("live-%d", i), "n1|1", func(bool) {})
	}
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	routed := make(chan string, 10)
	shard := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if d, ok := c.Message().(*supervisor.Deliver); ok {
			switch m := d.Msg.(type) {
			case *jobactor.Submit:
				_ = m.Delivery.Ack()
				routed <- "submit " + d.JobID
			case *jobactor.Result:
				_ = m.Delivery.Ack()
				routed <- "result " + d.JobID
			}
		}
	}))
	in := &Intake{Store: st, Log: log, Shards: []*actor.PID{shard}, Env: &jobactor.Env{NodeID: "n1", Log: log,
		Subjects: subj, Root: sys.Root, Renewer: rn, Publish: func(string, []byte) error { return nil }}}
	polls := make(chan struct{}, 1000)
	notHeld := func() bool {
		select {
		case polls <- struct{}{}:
		default:
		}
		return false
	}
	req, err := bus.EncodeRequest("tr-1", "client", &capv1.JobRequest{JobId: "one-more", Topic: "job.echo"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := bus.EncodeResult("tr-2", "another-node", &capv1.JobResult{JobId: "ending",
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
	if err := in.Consume(ctx, js, prefix, notHeld); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-routed:
		if m != "result ending" {
			t.Fatalf("%s taken at MaxLiveLocks live locks", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the result was not taken at MaxLiveLocks live locks")
	}
	for i := 0; i < 4*bus.FetchLoops+int(bus.FetchMaxWait/bus.HoldPoll); i++ {
		select {
		case <-polls:
		case <-time.After(10 * time.Second):
			t.Fatalf("the submit loops stopped polling after %d polls", i)
		}
	}
	select {
	case m := <-routed:
		t.Fatalf("%s taken at MaxLiveLocks live locks", m)
	default:
	}
	rn.Forget("live-0", "n1|1")
	select {
	case m := <-routed:
		if m != "submit one-more" {
			t.Fatalf("taken %s", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the submit was not taken once a live lock went")
	}
}
