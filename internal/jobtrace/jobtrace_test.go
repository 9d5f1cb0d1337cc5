package jobtrace_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/jobtrace"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/testenv"
)

// The messages a job actor's mailbox sees on the happy path, reduced to
// what changes its state.
type (
	submit   struct{}
	stored   struct{ state, reason string }
	progress struct{}
	result   struct{}
	ping     struct{}
	crash    struct{}
)

// jobLike is a job actor in miniature: it moves through the states the
// real one does and reports them through TraceState.
type jobLike struct {
	state, reason string
	done          chan struct{} // closed on Stopped, if set
}

func (j *jobLike) TraceState() (string, string) { return j.state, j.reason }

func (j *jobLike) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *submit:
		j.state, j.reason = "PENDING", "submitted"
	case *stored:
		j.state, j.reason = m.state, m.reason
	case *progress:
		j.state, j.reason = "RUNNING", "started"
	case *result:
		j.state, j.reason = "SUCCEEDED", "completed"
		c.Poison(c.Self())
	case *ping:
		c.Respond("pong")
	case *crash:
		panic("injected")
	case *actor.Stopped:
		if j.done != nil {
			close(j.done)
		}
	}
}

// shard spawns job actors as its children, as the node's job shards do, so
// their PID ids are "<shard>/<job_id>".
type shard struct{ props *actor.Props }

type spawnJob struct{ id string }

func (s *shard) Receive(c actor.Context) {
	if m, ok := c.Message().(*spawnJob); ok {
		pid, err := c.SpawnNamed(s.props, m.id)
		if err != nil {
			panic(err)
		}
		c.Respond(pid)
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

type bundle struct {
	sys    *actor.ActorSystem
	tracer *jobtrace.Tracer
	keys   *store.Keys
	env    *testenv.Env
}

func setup(t *testing.T, mutate func(*jobtrace.Config)) *bundle {
	t.Helper()
	env := testenv.New(t)
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	keys := store.NewKeys(env.KeyPrefix())
	cfg := jobtrace.Config{Enabled: true, Redis: env.Redis, Keys: keys, NodeID: "node-t", Log: quiet(),
		Origin: func(msg interface{}) string {
			if _, ok := msg.(*submit); ok {
				return "intake"
			}
			return ""
		}}
	if mutate != nil {
		mutate(&cfg)
	}
	tr, err := jobtrace.New(sys, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return &bundle{sys: sys, tracer: tr, keys: keys, env: env}
}

// spawn starts a traced job actor named id under a shard.
func (b *bundle) spawn(t *testing.T, id string, j *jobLike) *actor.PID {
	t.Helper()
	// A restart produces a fresh instance, as the node's producer does.
	first := true
	props := actor.PropsFromProducer(func() actor.Actor {
		if first {
			first = false
			return j
		}
		return &jobLike{}
	}, b.tracer.PropsOptions()...)
	sh := b.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &shard{props: props} }))
	res, err := b.sys.Root.RequestFuture(sh, &spawnJob{id: id}, 5*time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	return res.(*actor.PID)
}

// waitLive polls a job's live ring until done accepts it (bounded): the
// middleware records a message after the actor has handled it, so a reply
// can arrive before the entry of the request it answers.
func waitLive(t *testing.T, tr *jobtrace.Tracer, id string, done func([]jobtrace.Entry) bool) []jobtrace.Entry {
	t.Helper()
	var es []jobtrace.Entry
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if es, _ = tr.Live(id); done(es) {
			return es
		}
	}
	t.Fatalf("live ring of %s never complete: %+v", id, es)
	return nil
}

func types(es []jobtrace.Entry) string {
	var b strings.Builder
	for _, e := range es {
		b.WriteString(strings.TrimPrefix(e.Type, "*"))
		b.WriteString(" ")
	}
	return strings.TrimSpace(b.String())
}

func TestTraceOfJobFromSubmitToSucceededIsPersistedInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	j := &jobLike{done: make(chan struct{})}
	pid := b.spawn(t, "job-ok", j)
	root := b.sys.Root
	root.Send(pid, &submit{})
	root.Send(pid, &stored{"SCHEDULED", "allowed"})
	root.Send(pid, &stored{"DISPATCHED", "dispatched"})
	// A request carries its sender; the trace names it.
	if _, err := root.RequestFuture(pid, &ping{}, 5*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	// The reply to the ping leaves before the middleware records the ping,
	// so wait for its entry rather than expect it.
	live := waitLive(t, b.tracer, "job-ok", func(es []jobtrace.Entry) bool { return len(es) == 5 })
	if !live[0].Live || !strings.HasSuffix(live[4].Type, "ping") {
		t.Fatalf("live ring of a running job: %+v", live)
	}
	root.Send(pid, &progress{})
	root.Send(pid, &result{})
	<-j.done

	var es []jobtrace.Entry
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		var err error
		es, err = jobtrace.Load(context.Background(), b.env.Redis, b.keys, "job-ok")
		if err != nil {
			t.Fatal(err)
		}
		if len(es) > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	want := "actor.Started jobtrace_test.submit jobtrace_test.stored jobtrace_test.stored jobtrace_test.ping " +
		"jobtrace_test.progress jobtrace_test.result actor.PoisonPill actor.Stopping actor.Stopped"
	if got := types(es); got != want {
		t.Fatalf("persisted message types\n got %s\nwant %s", got, want)
	}
	path := []struct{ before, after, reason string }{
		{"", "", ""},
		{"", "PENDING", "submitted"},
		{"PENDING", "SCHEDULED", "allowed"},
		{"SCHEDULED", "DISPATCHED", "dispatched"},
		{"DISPATCHED", "DISPATCHED", "dispatched"},
		{"DISPATCHED", "RUNNING", "started"},
		{"RUNNING", "SUCCEEDED", "completed"},
	}
	for i, p := range path {
		e := es[i]
		if e.Before != p.before || e.After != p.after || e.Reason != p.reason {
			t.Errorf("entry %d (%s): %s → %s (%s), want %s → %s (%s)", i, e.Type, e.Before, e.After, e.Reason,
				p.before, p.after, p.reason)
		}
	}
	for i, e := range es {
		if e.Seq != uint64(i) || e.Node != "node-t" || e.Live || e.Dropped != 0 {
			t.Errorf("entry %d: seq %d node %q live %v dropped %d", i, e.Seq, e.Node, e.Live, e.Dropped)
		}
		if i > 0 && e.At.Before(es[i-1].At) {
			t.Errorf("entry %d recorded before entry %d", i, i-1)
		}
	}
	if es[1].Sender != "intake" {
		t.Errorf("submit sender %q, want the configured origin", es[1].Sender)
	}
	if !strings.HasPrefix(es[4].Sender, "future") {
		t.Errorf("request sender %q, want the future's PID", es[4].Sender)
	}
	// A terminal job's trace expires with its record.
	ttl := b.env.Redis.TTL(context.Background(), b.keys.Trace("job-ok")).Val()
	if ttl <= 0 || ttl > store.RetentionDefault {
		t.Errorf("trace TTL %v, want (0, %v]", ttl, store.RetentionDefault)
	}
	// The trace no longer comes from a live ring.
	if _, ok := b.tracer.Live("job-ok"); ok {
		t.Error("stopped job still has a live ring")
	}
	all, err := b.tracer.Trace(context.Background(), "job-ok")
	if err != nil || len(all) != len(es) {
		t.Fatalf("Trace after stop: %d entries, err %v; want the %d persisted", len(all), err, len(es))
	}
}

func TestRingKeepsTheNewestEntriesAndCountsTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *jobtrace.Config) { c.RingSize = 4 })
	pid := b.spawn(t, "job-busy", &jobLike{})
	for i := 0; i < 9; i++ {
		b.sys.Root.Send(pid, &stored{fmt.Sprint("S", i), ""})
	}
	if _, err := b.sys.Root.RequestFuture(pid, &ping{}, 5*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	es := waitLive(t, b.tracer, "job-busy", func(es []jobtrace.Entry) bool {
		return len(es) > 0 && strings.HasSuffix(es[len(es)-1].Type, "ping")
	})
	// Started + 9 stored + ping = 11 messages; the last 4 are kept.
	if len(es) != 4 || es[0].Dropped != 7 || es[0].Seq != 7 || es[3].Seq != 10 {
		t.Fatalf("ring: %+v", es)
	}
	if es[0].After != "S6" || !strings.HasSuffix(es[3].Type, "ping") {
		t.Fatalf("ring holds the wrong entries: %s … %s", es[0].After, es[3].Type)
	}
}

func TestRingSurvivesARestart(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	pid := b.spawn(t, "job-crash", &jobLike{})
	b.sys.Root.Send(pid, &submit{})
	b.sys.Root.Send(pid, &crash{})
	if _, err := b.sys.Root.RequestFuture(pid, &ping{}, 5*time.Second).Result(); err != nil {
		t.Fatal(err)
	}
	es := waitLive(t, b.tracer, "job-crash", func(es []jobtrace.Entry) bool {
		return len(es) > 0 && strings.HasSuffix(es[len(es)-1].Type, "ping")
	})
	want := "actor.Started jobtrace_test.submit jobtrace_test.crash actor.Restarting actor.Started jobtrace_test.ping"
	if got := types(es); got != want {
		t.Fatalf("trace across a restart\n got %s\nwant %s", got, want)
	}
	if !es[2].Panicked || es[2].Before != "PENDING" {
		t.Fatalf("the crashing message: %+v", es[2])
	}
	// The fresh instance starts with empty memory, and the trace says so.
	if es[4].After != "" {
		t.Fatalf("state after the restart %q, want the new instance's empty state", es[4].After)
	}
}

func TestTracingOffInstallsNothing(t *testing.T) {
	t.Parallel()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	tr, err := jobtrace.New(sys, jobtrace.Config{Enabled: false})
	if err != nil || tr != nil {
		t.Fatalf("disabled tracer = %v, %v; want nil", tr, err)
	}
	if opts := tr.PropsOptions(); len(opts) != 0 {
		t.Fatalf("tracing off adds %d props options", len(opts))
	}
	if tr.Middleware() != nil || jobtrace.FromSystem(sys) != nil {
		t.Fatal("tracing off still provides a middleware or an extension")
	}
	if _, err := tr.Trace(context.Background(), "x"); err == nil {
		t.Fatal("Trace on a disabled tracer should say tracing is off")
	}
	tr.Close() // a no-op, not a panic
}
