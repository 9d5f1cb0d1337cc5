package supervisor_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/intake"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
)

// settled is how a delivery was settled: acked, or nak'd after delay.
type settled struct {
	id    string
	acked bool
	delay time.Duration
}

// recDelivery reports its settlement on ch.
type recDelivery struct {
	id string
	ch chan settled
}

func (d recDelivery) Ack() error { d.ch <- settled{id: d.id, acked: true}; return nil }
func (d recDelivery) NakWithDelay(delay time.Duration) error {
	d.ch <- settled{id: d.id, delay: delay}
	return nil
}
func (d recDelivery) InProgress() error { return nil }

// shardStub reports the job ids of the events it is given; as an owner's
// shard it also settles them: ids starting "take" acked, others nak'd.
type shardStub struct {
	got    chan string
	settle bool
}

func (s *shardStub) Receive(c actor.Context) {
	d, ok := c.Message().(*supervisor.Deliver)
	if !ok {
		return
	}
	if r, ok := d.Msg.(*jobactor.Result); ok && s.settle {
		if strings.HasPrefix(d.JobID, "take") {
			_ = r.Delivery.Ack()
		} else {
			_ = r.Delivery.NakWithDelay(time.Second)
		}
	}
	s.got <- d.JobID
}

// The events of one lock read go to each owner in one request, and each
// delivery is settled by its own event's outcome: taken ones acked, the
// ones the owner refused nak'd after a second, a gone owner's nak'd until
// its lock lapses. An owner that has not answered yet holds no other
// owner's events; events whose lock is not another node's go back to the
// shard.
func TestResolverSettlesEachEventByItsOwnOutcome(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	subj := bus.NewSubjects(env.Prefix)
	nc := env.NATS
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sys := actor.NewActorSystem()
	root := sys.Root

	// Owner "a" runs the real inbox; "b" has no node; "c" is answered by hand.
	ownerGot := make(chan string, 16)
	ownerShard := root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &shardStub{got: ownerGot, settle: true} }))
	a := &intake.Intake{Log: log, Shards: []*actor.PID{ownerShard}, Env: &jobactor.Env{NodeID: "a", Log: log, Root: root}}
	subA, err := nc.Subscribe(subj.Inbox("a"), a.HandleInbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = subA.Unsubscribe() }()
	countA, err := nc.SubscribeSync(subj.Inbox("a"))
	if err != nil {
		t.Fatal(err)
	}
	toC := make(chan *nats.Msg, 4)
	subC, err := nc.ChanSubscribe(subj.Inbox("c"), toC)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = subC.Unsubscribe() }()

	locks := map[string]string{"gate": "", "take-a1": "a|1", "refuse-a2": "a|2", "take-a3": "a|3",
		"b1": "b|1", "b2": "b|1", "c1": "c|4", "c2": "c|5", "mine": "self|6", "nolock": "", "parked": "a|7|p"}
	gateRead, release := make(chan struct{}), make(chan struct{})
	holders := func(_ context.Context, ids []string) ([]string, error) {
		out := make([]string, len(ids))
		for i, id := range ids {
			if id == "gate" {
				close(gateRead)
				<-release
			}
			out[i] = locks[id]
		}
		return out, nil
	}
	forwarded := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "forwarded"}, []string{"outcome"})
	r := supervisor.NewResolver(supervisor.ResolverConfig{NodeID: "self", Holders: holders,
		ForwardBatch: intake.BatchForwarder(nc, subj), Forwarded: forwarded,
		OwnerWait: func(context.Context, string) (time.Duration, error) { return 7 * time.Second, nil },
		LockTTL:   time.Minute, Root: root, Log: log})
	defer r.Stop()
	backGot := make(chan string, 16)
	shard := root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &shardStub{got: backGot} }))

	settledCh := make(chan settled, 16)
	ask := func(id string) {
		raw, err := bus.EncodeResult("trace-"+id, "w1", &capv1.JobResult{JobId: id, Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED})
		if err != nil {
			t.Fatal(err)
		}
		res := &jobactor.Result{Res: &capv1.JobResult{JobId: id}, Raw: raw, Delivery: recDelivery{id: id, ch: settledCh}}
		if !r.Ask(shard, &supervisor.Deliver{JobID: id, Msg: res, Spawn: true}) {
			t.Fatalf("%s: the resolver's queue is full", id)
		}
	}
	// The gate's lock read holds the loop until every other event is
	// queued, so they make one batch.
	ask("gate")
	<-gateRead
	for _, id := range []string{"take-a1", "refuse-a2", "b1", "c1", "mine", "take-a3", "b2", "c2", "nolock", "parked"} {
		ask(id)
	}
	close(release)

	wait := func(what string, ch <-chan settled, n int) map[string]settled {
		got := map[string]settled{}
		for len(got) < n {
			select {
			case s := <-ch:
				got[s.id] = s
			case <-time.After(15 * time.Second):
				t.Fatalf("%s: settled %v, want %d", what, got, n)
			}
		}
		return got
	}
	// Owners a and b settle while c's request is still unanswered.
	got := wait("owners a and b", settledCh, 5)
	want := map[string]settled{"take-a1": {id: "take-a1", acked: true}, "refuse-a2": {id: "refuse-a2", delay: time.Second},
		"take-a3": {id: "take-a3", acked: true}, "b1": {id: "b1", delay: 7250 * time.Millisecond},
		"b2": {id: "b2", delay: 7250 * time.Millisecond}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("settled %v\nwant    %v", got, want)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := countA.Pending(); n != 1 {
		t.Fatalf("%d requests to owner a for its 3 events, want 1", n)
	}
	var back []string
	for len(back) < 4 {
		select {
		case id := <-backGot:
			back = append(back, id)
		case <-time.After(15 * time.Second):
			t.Fatalf("back to the shard: %v, want 4 events", back)
		}
	}
	if fmt.Sprint(back) != "[gate mine nolock parked]" {
		t.Fatalf("back to the shard: %v", back)
	}

	// Owner c answers its batch now: its first event taken, its second not.
	var req *nats.Msg
	select {
	case req = <-toC:
	case <-time.After(15 * time.Second):
		t.Fatal("no request reached owner c")
	}
	if req.Header.Get(intake.HeaderKind) != intake.KindBatch {
		t.Fatalf("owner c got a %q request, want a batch", req.Header.Get(intake.HeaderKind))
	}
	select {
	case s := <-settledCh:
		t.Fatalf("%v settled before its owner answered", s)
	default:
	}
	reply := &nats.Msg{Header: nats.Header{}, Data: []byte("an")}
	reply.Header.Set(intake.HeaderKind, intake.KindBatch)
	if err := req.RespondMsg(reply); err != nil {
		t.Fatal(err)
	}
	got = wait("owner c", settledCh, 2)
	if got["c1"] != (settled{id: "c1", acked: true}) || got["c2"] != (settled{id: "c2", delay: time.Second}) {
		t.Fatalf("owner c's events settled %v", got)
	}
	for outcome, want := range map[string]float64{"taken": 3, "returned": 4} {
		var m dto.Metric
		if err := forwarded.WithLabelValues(outcome).Write(&m); err != nil || m.GetCounter().GetValue() != want {
			t.Fatalf("forwards counted %s: %v (%v), want %v", outcome, m.GetCounter().GetValue(), err, want)
		}
	}
}
