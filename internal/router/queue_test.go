package router

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// probe stands in for job actors: it asks the router on their behalf (so
// placements come back to it) and reports replies and placements. It
// takes every placement (Took Used).
type probe struct {
	router  *actor.PID
	replies chan *PickReply
	placed  chan *Placed
	// noTook: placements are reported but not answered (still on their
	// way to the job, as far as the router knows).
	noTook atomic.Bool
}

func (p *probe) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *PickRequest:
		c.Request(p.router, m)
	case *PickReply:
		p.replies <- m
	case *Placed:
		if !p.noTook.Load() {
			c.Send(p.router, &Took{JobID: m.JobID, WorkerID: m.Reply.WorkerID, Ticket: m.Ticket, Used: true})
		}
		p.placed <- m
	}
}

func startProbe(b *routerBundle) (*actor.PID, *probe) {
	p := &probe{router: b.pid, replies: make(chan *PickReply, 64), placed: make(chan *Placed, 64)}
	return b.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return p })), p
}

func (p *probe) reply(t *testing.T) *PickReply {
	t.Helper()
	select {
	case r := <-p.replies:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no pick reply")
		return nil
	}
}

func (p *probe) next(t *testing.T) *Placed {
	t.Helper()
	select {
	case m := <-p.placed:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no placement")
		return nil
	}
}

// TestCapacityQueueOrder: with no room, jobs wait in order — higher
// priority first; within a priority, tenants take turns; within a tenant,
// the oldest submit first — and each freed slot goes to the head at once.
func TestCapacityQueueOrder(t *testing.T) {
	t.Parallel()
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n")})
	b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "a", MaxParallelJobs: 1}, time.Now())
	pid, p := startProbe(b)
	t0 := time.Now()
	ask := func(id, tenant string, prio capv1.JobPriority, submitted time.Duration) *PickReply {
		b.sys.Root.Send(pid, &PickRequest{JobID: id, Wait: true, Ticket: 1, Submitted: t0.Add(submitted),
			Req: &capv1.JobRequest{JobId: id, Topic: "job.a", TenantId: tenant, Priority: prio}})
		return p.reply(t)
	}
	if r := ask("first", "x", 0, 0); r.WorkerID != "w1" {
		t.Fatalf("first pick = %+v, want w1", r)
	}
	jobs := []struct {
		id, tenant string
		prio       capv1.JobPriority
		submitted  time.Duration
	}{
		{"x-late", "x", 0, 2 * time.Millisecond},
		{"x-early", "x", 0, time.Millisecond},
		{"x-last", "x", 0, 3 * time.Millisecond},
		{"y-one", "y", 0, 10 * time.Millisecond},
		{"z-critical", "z", capv1.JobPriority_JOB_PRIORITY_CRITICAL, 20 * time.Millisecond},
		{"y-batch", "y", capv1.JobPriority_JOB_PRIORITY_BATCH, 0},
	}
	for _, j := range jobs {
		r := ask(j.id, j.tenant, j.prio, j.submitted)
		if !r.Queued || r.Reason != jobstate.ReasonPoolOverloaded {
			t.Fatalf("%s: reply %+v, want queued pool_overloaded", j.id, r)
		}
	}
	want := []string{"z-critical", "x-early", "y-one", "x-late", "x-last", "y-batch"}
	for i, id := range want {
		if pos := b.ask(t, &QueuePosition{JobID: id}).(int); pos != i {
			t.Errorf("position of %s = %d, want %d", id, pos, i)
		}
	}
	running := "first"
	for _, id := range want {
		b.sys.Root.Send(b.pid, &Released{WorkerID: "w1", JobID: running, Done: true})
		m := p.next(t)
		if m.JobID != id || m.Reply.WorkerID != "w1" {
			t.Fatalf("placed %s on %q, want %s on w1", m.JobID, m.Reply.WorkerID, id)
		}
		running = id
	}
	if pos := b.ask(t, &QueuePosition{JobID: "y-batch"}).(int); pos != -1 {
		t.Fatalf("placed job still has position %d", pos)
	}
}

// TestCapacityQueueWakeSources: a waiting job is placed when a heartbeat
// shows room, when a worker joins, and when another replica's report frees
// a slot — and a withdrawn job is not placed.
func TestCapacityQueueWakeSources(t *testing.T) {
	t.Parallel()
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), NodeID: "me",
		Gossip: func([]byte) {}})
	pid, p := startProbe(b)
	ask := func(id string) *PickReply {
		b.sys.Root.Send(pid, &PickRequest{JobID: id, Wait: true, Ticket: 1,
			Req: &capv1.JobRequest{JobId: id, Topic: "job.a"}})
		return p.reply(t)
	}
	// No worker: no_workers, queued; a worker joining places it.
	if r := ask("j1"); !r.Queued || r.Reason != jobstate.ReasonNoWorkers {
		t.Fatalf("reply %+v, want queued no_workers", r)
	}
	now := time.Now()
	// A worker this router keeps placing on once "peer" is heard (it owns
	// it by the rendezvous hash), so the peer's counts are what matter.
	w1 := "w1"
	for i := 2; stewardScore("peer", w1) > stewardScore("me", w1); i++ {
		w1 = "w" + strconv.Itoa(i)
	}
	b.beat(&capv1.Heartbeat{WorkerId: w1, Pool: "a", MaxParallelJobs: 2, ActiveJobs: 2}, now)
	// The heartbeat says the worker is full (2 jobs this router does not
	// know): j1 still waits.
	if r := ask("j1"); !r.Queued || r.Reason != jobstate.ReasonPoolOverloaded {
		t.Fatalf("reply %+v, want queued pool_overloaded", r)
	}
	// The next heartbeat shows room.
	b.beat(&capv1.Heartbeat{WorkerId: w1, Pool: "a", MaxParallelJobs: 2, ActiveJobs: 1}, now.Add(time.Second))
	if m := p.next(t); m.JobID != "j1" {
		t.Fatalf("placed %s, want j1", m.JobID)
	}
	// Now full with j1 and one foreign job; another replica says it holds
	// one of them…
	b.sys.Root.Send(b.pid, &PeerLoad{Node: "peer", Full: true, Counts: map[string]int32{w1: 1}, At: time.Now()})
	if r := ask("j2"); !r.Queued {
		t.Fatalf("reply %+v, want queued", r)
	}
	if r := ask("j3"); !r.Queued {
		t.Fatalf("reply %+v, want queued", r)
	}
	b.sys.Root.Send(b.pid, &Withdraw{JobID: "j2", Ticket: 1})
	// …and then that it holds none: the slot goes to j3 (j2 withdrew).
	b.sys.Root.Send(b.pid, &PeerLoad{Node: "peer", Full: true, Counts: map[string]int32{}, At: time.Now()})
	if m := p.next(t); m.JobID != "j3" {
		t.Fatalf("placed %s, want j3", m.JobID)
	}
	select {
	case m := <-p.placed:
		t.Fatalf("unexpected placement of %s", m.JobID)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestCapacityUnusedPlacementIsFreed: a placement the job does not take
// (Took not used) frees the slot for the next waiting job.
func TestCapacityUnusedPlacementIsFreed(t *testing.T) {
	t.Parallel()
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n")})
	b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "a", MaxParallelJobs: 1}, time.Now())
	pid, p := startProbe(b)
	ask := func(id string) *PickReply {
		b.sys.Root.Send(pid, &PickRequest{JobID: id, Wait: true, Ticket: 1,
			Req: &capv1.JobRequest{JobId: id, Topic: "job.a"}})
		return p.reply(t)
	}
	ask("a")
	ask("b")
	ask("c")
	b.sys.Root.Send(b.pid, &Released{WorkerID: "w1", JobID: "a", Done: true})
	if m := p.next(t); m.JobID != "b" {
		t.Fatalf("placed %s, want b", m.JobID)
	}
	// The probe took b; now b's job says it did not use it after all.
	b.sys.Root.Send(b.pid, &Withdraw{JobID: "b", Ticket: 1}) // no effect: b was taken
	b.sys.Root.Send(b.pid, &Released{WorkerID: "w1", JobID: "b", Done: true})
	if m := p.next(t); m.JobID != "c" {
		t.Fatalf("placed %s, want c", m.JobID)
	}
}

// TestCapacityRecheckKeepsAPlacementOnItsWay: a waiting job that asks
// again (its recheck, same ticket) while the router's placement is on its
// way to it keeps that placement: the router answers Queued, and neither
// frees the slot for another job nor places the job a second time.
func TestCapacityRecheckKeepsAPlacementOnItsWay(t *testing.T) {
	t.Parallel()
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n")})
	b.beat(&capv1.Heartbeat{WorkerId: "w1", Pool: "a", MaxParallelJobs: 1}, time.Now())
	pid, p := startProbe(b)
	p.noTook.Store(true)
	ask := func(id string, ticket uint64) *PickReply {
		b.sys.Root.Send(pid, &PickRequest{JobID: id, Wait: true, Ticket: ticket,
			Req: &capv1.JobRequest{JobId: id, Topic: "job.a"}})
		return p.reply(t)
	}
	if r := ask("a", 1); r.WorkerID != "w1" {
		t.Fatalf("a: %+v, want placed on w1", r)
	}
	if r := ask("b", 1); !r.Queued {
		t.Fatalf("b: %+v, want queued", r)
	}
	b.sys.Root.Send(b.pid, &Released{WorkerID: "w1", JobID: "a", Done: true})
	if m := p.next(t); m.JobID != "b" {
		t.Fatalf("placed %s, want b", m.JobID)
	}
	// b's recheck crosses the placement.
	if r := ask("b", 1); !r.Queued || r.WorkerID != "" {
		t.Fatalf("b asking again with its placement on the way: %+v, want queued", r)
	}
	if r := ask("c", 1); !r.Queued {
		t.Fatalf("c: %+v, want queued (w1's slot is b's)", r)
	}
	select {
	case m := <-p.placed:
		t.Fatalf("placed %s again while b's placement was on its way", m.JobID)
	case <-time.After(50 * time.Millisecond):
	}
	// b takes it; when it ends, c gets the slot.
	b.sys.Root.Send(b.pid, &Took{JobID: "b", WorkerID: "w1", Ticket: 1, Used: true})
	b.sys.Root.Send(b.pid, &Released{WorkerID: "w1", JobID: "b", Done: true})
	if m := p.next(t); m.JobID != "c" {
		t.Fatalf("placed %s, want c", m.JobID)
	}
	// A new wait (another ticket, a restarted actor) frees a placement
	// still on its way to the old one.
	if r := ask("c", 2); r.WorkerID != "w1" {
		t.Fatalf("c asking under a new ticket: %+v, want placed on w1 (its old placement freed)", r)
	}
}

// TestPeerLoadDecodeRejectsGarbage: a capacity report that is not one is
// an error, never a panic, and a real one round-trips.
func TestPeerLoadDecodeRejectsGarbage(t *testing.T) {
	t.Parallel()
	in := &PeerLoad{Node: "node-a", Full: true, Hello: true, Counts: map[string]int32{"w1": 3, "w2": 0, "worker-with-a-long-id": 64},
		Waiting: map[string]int32{"gpu": 7}, Offers: []Offer{{To: "node-b", ID: 9, Worker: "w1", N: 2}},
		Acks: []OfferAck{{To: "node-c", ID: 4, Worker: "w2", Used: 1, Count: 5}}}
	m, err := DecodePeerLoad(EncodePeerLoad(in))
	if err != nil || m.Node != "node-a" || !m.Full || !m.Hello || len(m.Counts) != 3 || m.Counts["w1"] != 3 ||
		m.Counts["worker-with-a-long-id"] != 64 || m.Waiting["gpu"] != 7 || len(m.Offers) != 1 ||
		m.Offers[0] != in.Offers[0] || len(m.Acks) != 1 || m.Acks[0] != in.Acks[0] {
		t.Fatalf("round trip = %+v, %v", m, err)
	}
	good := EncodePeerLoad(&PeerLoad{Node: "n", Counts: map[string]int32{"w": 1}})
	for _, bad := range [][]byte{nil, {}, {9, 0}, good[:len(good)-1], append(append([]byte{}, good...), 0),
		{2, 0, 0}, {2, 4, 1, 'n', 0, 0, 0, 0}, {2, 0, 1, 'n', 0xff, 0xff, 0xff, 0xff, 0x0f}} {
		if _, err := DecodePeerLoad(bad); err == nil {
			t.Errorf("decoded %v without error", bad)
		}
	}
}

// TestCapacityHelloIsAnsweredByAReplicaThatKnowsTheSender: a replica's
// first report can go out before it listens for the others' (its router
// starts first), and their answer to it is lost. Its Hello, sent once it
// listens, makes every replica answer with a full report — also one that
// has heard it before — so it learns of them at once (not at their next
// sweep) and does not take every worker as its own meanwhile.
func TestCapacityHelloIsAnsweredByAReplicaThatKnowsTheSender(t *testing.T) {
	t.Parallel()
	sent := make(chan *PeerLoad, 64)
	b := setupRouter(t, Config{Pools: mustPools(t, "topics: {job.a: a}\n"), NodeID: "node-a",
		SweepEach: time.Hour, // no periodic full report: only answers
		Gossip: func(data []byte) {
			if m, err := DecodePeerLoad(data); err == nil {
				sent <- m
			}
		}})
	next := func(what string) *PeerLoad {
		t.Helper()
		select {
		case m := <-sent:
			return m
		case <-time.After(5 * time.Second):
			t.Fatalf("no report from node-a %s", what)
			return nil
		}
	}
	if m := next("at its start"); !m.Full || m.Hello {
		t.Fatalf("start report %+v, want full without hello", m)
	}
	b.sys.Root.Send(b.pid, &PeerLoad{Node: "node-b", Full: true, At: time.Now()}) // heard for the first time
	if m := next("for a new replica"); !m.Full || m.Hello {
		t.Fatalf("answer %+v, want full without hello", m)
	}
	b.sys.Root.Send(b.pid, &PeerLoad{Node: "node-b", Full: true, Hello: true, At: time.Now()})
	if m := next("in answer to node-b's hello"); !m.Full || m.Hello {
		t.Fatalf("answer %+v, want full without hello", m)
	}
	b.sys.Root.Send(b.pid, &Announce{})
	if m := next("on its announce"); !m.Full || !m.Hello {
		t.Fatalf("announce %+v, want full with hello", m)
	}
}

// FuzzDecodePeerLoad: no input makes the decoder panic.
func FuzzDecodePeerLoad(f *testing.F) {
	f.Add(EncodePeerLoad(&PeerLoad{Node: "node", Full: true, Counts: map[string]int32{"w1": 2},
		Waiting: map[string]int32{"p": 1}, Offers: []Offer{{To: "x", ID: 1, Worker: "w1", N: 1}}}))
	f.Add([]byte{2, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := DecodePeerLoad(b); err == nil {
			if _, err := DecodePeerLoad(EncodePeerLoad(m)); err != nil {
				t.Fatalf("re-encoded report does not decode: %v", err)
			}
		}
	})
}

// linkedRouters are two routers whose capacity reports reach each other
// (in memory, as NATS would carry them).
type linkedRouters struct {
	a, b *routerBundle
}

func linkRouters(t *testing.T, pools string) *linkedRouters {
	t.Helper()
	var l linkedRouters
	var toA, toB atomic.Pointer[routerBundle]
	deliver := func(to *atomic.Pointer[routerBundle]) func([]byte) {
		return func(data []byte) {
			m, err := DecodePeerLoad(data)
			if err != nil {
				t.Errorf("report does not decode: %v", err)
				return
			}
			m.At = time.Now()
			if b := to.Load(); b != nil {
				b.sys.Root.Send(b.pid, m)
			}
		}
	}
	l.a = setupRouter(t, Config{Pools: mustPools(t, pools), NodeID: "node-a", Gossip: deliver(&toB)})
	l.b = setupRouter(t, Config{Pools: mustPools(t, pools), NodeID: "node-b", Gossip: deliver(&toA)})
	toA.Store(l.a)
	toB.Store(l.b)
	l.b.sys.Root.Send(l.b.pid, &Announce{})
	l.a.sys.Root.Send(l.a.pid, &Announce{})
	return &l
}

// TestCapacityOffersServeAReplicaThatOwnsNothing: every worker is placed by
// node-a, and every job waits on node-b. node-a offers its idle room, so
// node-b's jobs run on it — and the two never count more than the
// workers' max_parallel between them.
func TestCapacityOffersServeAReplicaThatOwnsNothing(t *testing.T) {
	t.Parallel()
	l := linkRouters(t, "topics: {job.a: a}\n")
	// Worker ids node-a ranks first on: with max_parallel 1 and two
	// replicas, node-a's share is the one slot and node-b's is none.
	var ids []string
	for i := 0; len(ids) < 3; i++ {
		id := "w" + strconv.Itoa(i)
		if stewardScore("node-a", id) > stewardScore("node-b", id) {
			ids = append(ids, id)
		}
	}
	now := time.Now()
	for _, id := range ids {
		hb := &capv1.Heartbeat{WorkerId: id, Pool: "a", MaxParallelJobs: 1}
		l.a.beat(hb, now)
		l.b.beat(hb, now)
	}
	// Both know each other and agree node-a owns the three.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ws := l.b.workers(t)
		if len(ws) == 3 && ws[0].Steward == "node-a" && ws[1].Steward == "node-a" && ws[2].Steward == "node-a" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-b workers %+v", ws)
		}
		time.Sleep(5 * time.Millisecond)
	}
	pid, p := startProbe(l.b)
	const jobs = 20
	for i := range jobs {
		id := "job-" + strconv.Itoa(i)
		l.b.sys.Root.Send(pid, &PickRequest{JobID: id, Wait: true, Ticket: 1,
			Req: &capv1.JobRequest{JobId: id, Topic: "job.a"}})
		if r := p.reply(t); !r.Queued || r.Reason != jobstate.ReasonPoolOverloaded {
			t.Fatalf("%s: %+v, want queued pool_overloaded (room belongs to node-a)", id, r)
		}
	}
	// node-a offers its three slots; node-b places three jobs, no more.
	held := map[string][]string{}
	for range 3 {
		m := p.next(t)
		held[m.Reply.WorkerID] = append(held[m.Reply.WorkerID], m.JobID)
	}
	select {
	case m := <-p.placed:
		t.Fatalf("a seventh job was placed (%s on %s) on three workers of max_parallel 1", m.JobID, m.Reply.WorkerID)
	case <-time.After(100 * time.Millisecond):
	}
	for w, js := range held {
		if len(js) != 1 {
			t.Fatalf("worker %s got %d jobs, want 1 (%v)", w, len(js), held)
		}
	}
	// Each end frees a slot that node-b refills at once (node-a has no
	// jobs waiting); every job runs, never more than one per worker.
	done := 3
	for done < jobs {
		for w, js := range held {
			if len(js) == 0 {
				continue
			}
			l.b.sys.Root.Send(l.b.pid, &Released{WorkerID: w, JobID: js[0], Done: true})
			held[w] = js[1:]
			m := p.next(t)
			held[m.Reply.WorkerID] = append(held[m.Reply.WorkerID], m.JobID)
			if n := len(held[m.Reply.WorkerID]); n > 1 {
				t.Fatalf("worker %s holds %d jobs", m.Reply.WorkerID, n)
			}
			done++
			break
		}
	}
	// node-a's own view: it holds none itself, node-b three.
	for _, w := range l.a.workers(t) {
		if w.Dispatched != 0 || w.InFlight > 1 {
			t.Fatalf("node-a sees %+v", w)
		}
	}
}
