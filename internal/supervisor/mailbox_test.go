package supervisor_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/supervisor"
)

// recorder is a MessageInvoker that records what it is handed; a user
// message "panic" panics, as a failing actor would, and its escalation
// suspends the mailbox, as protoactor's actor context does.
type recorder struct {
	mb        actor.Mailbox
	mu        sync.Mutex
	got       []string
	escalated []string
	done      chan struct{}
	want      int
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, s)
	if len(r.got) == r.want {
		close(r.done)
	}
}
func (r *recorder) InvokeSystemMessage(m interface{}) { r.add(fmt.Sprint("sys:", m)) }
func (r *recorder) InvokeUserMessage(m interface{}) {
	if m == "panic" {
		panic("boom")
	}
	r.add(fmt.Sprint("user:", m))
}
func (r *recorder) EscalateFailure(reason, m interface{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.escalated = append(r.escalated, fmt.Sprint(reason, " on ", m))
	r.mb.PostSystemMessage(&actor.SuspendMailbox{})
}

// held is a dispatcher that runs a scheduled mailbox only when told, so a
// test can queue messages before the run starts.
type held struct{ runs chan func() }

func (d *held) Schedule(fn func()) { d.runs <- fn }
func (d *held) Throughput() int    { return 300 }

func wait(t *testing.T, r *recorder) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("handled %v", r.got)
	}
}

// System messages run before the user messages queued with them; a panic
// is escalated with the message that caused it; a suspended mailbox holds
// user messages until it is resumed; one run is scheduled for many posts.
func TestMailboxOrdersSuspendsAndEscalates(t *testing.T) {
	r := &recorder{done: make(chan struct{}), want: 5}
	d := &held{runs: make(chan func(), 10)}
	mb := supervisor.NewMailbox()
	r.mb = mb
	mb.RegisterHandlers(r, d)
	mb.PostUserMessage("a")
	mb.PostUserMessage("panic")
	mb.PostUserMessage("b")
	mb.PostSystemMessage("s1")
	if n := len(d.runs); n != 1 {
		t.Fatalf("%d runs scheduled for 4 posts, want 1", n)
	}
	if n := mb.UserMessageCount(); n != 3 {
		t.Fatalf("user messages queued %d, want 3", n)
	}
	(<-d.runs)()
	// The panic's escalation suspended the mailbox after "a"; "b" is held.
	r.mu.Lock()
	got, esc := append([]string(nil), r.got...), append([]string(nil), r.escalated...)
	r.mu.Unlock()
	if fmt.Sprint(got) != "[sys:s1 user:a]" || fmt.Sprint(esc) != "[boom on panic]" {
		t.Fatalf("first run handled %v and escalated %v", got, esc)
	}
	mb.PostUserMessage("c")
	select {
	case run := <-d.runs:
		run()
	default:
	}
	r.mu.Lock()
	if len(r.got) != 2 {
		t.Fatalf("a suspended mailbox handled %v", r.got)
	}
	r.mu.Unlock()
	mb.PostSystemMessage(&actor.ResumeMailbox{})
	mb.PostSystemMessage("s2")
	for len(d.runs) > 0 {
		(<-d.runs)()
	}
	wait(t, r)
	if fmt.Sprint(r.got) != "[sys:s1 user:a sys:s2 user:b user:c]" {
		t.Fatalf("handled %v", r.got)
	}
}

// Posts from many goroutines while runs go on: every message is handled
// once, in each sender's order, and no run overlaps another.
func TestMailboxConcurrentPosts(t *testing.T) {
	const senders, each = 8, 2000
	type msg struct{ from, n int }
	var (
		mu      sync.Mutex
		last    = make([]int, senders)
		total   int
		running atomic.Int32
		bad     string
		done    = make(chan struct{})
	)
	inv := invokerFunc(func(m interface{}) {
		overlap := running.Add(1) != 1
		defer running.Add(-1)
		mu.Lock()
		defer mu.Unlock()
		if overlap && bad == "" {
			bad = "two runs at once"
		}
		v := m.(msg)
		if v.n != last[v.from]+1 && bad == "" {
			bad = fmt.Sprintf("sender %d: %d after %d", v.from, v.n, last[v.from])
		}
		last[v.from] = v.n
		if total++; total == senders*each {
			close(done)
		}
	})
	d := supervisor.NewPoolDispatcher()
	defer d.Close()
	mb := supervisor.NewMailbox()
	mb.RegisterHandlers(inv, d)
	for s := 0; s < senders; s++ {
		go func() {
			for i := 1; i <= each; i++ {
				mb.PostUserMessage(msg{s, i})
			}
		}()
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d messages handled", total, senders*each)
	}
	mu.Lock()
	defer mu.Unlock()
	if bad != "" {
		t.Fatal(bad)
	}
}

type invokerFunc func(interface{})

func (f invokerFunc) InvokeSystemMessage(interface{})          {}
func (f invokerFunc) InvokeUserMessage(m interface{})          { f(m) }
func (f invokerFunc) EscalateFailure(interface{}, interface{}) {}

// A Mailbox on a PoolDispatcher is one allocation, itself: it is queued on
// the pool as itself, with no func bound to it (issue 33 round 12); on
// another dispatcher it binds its run function once (two).
func TestMailboxOnPoolIsOneAllocation(t *testing.T) {
	d := supervisor.NewPoolDispatcher()
	defer d.Close()
	inv := invokerFunc(func(interface{}) {})
	if n := testing.AllocsPerRun(200, func() { supervisor.NewMailbox().RegisterHandlers(inv, d) }); n != 1 {
		t.Fatalf("a Mailbox on the pool: %v allocations, want 1", n)
	}
	other := &held{runs: make(chan func(), 1)}
	if n := testing.AllocsPerRun(200, func() { supervisor.NewMailbox().RegisterHandlers(inv, other) }); n != 2 {
		t.Fatalf("a Mailbox on another dispatcher: %v allocations, want 2", n)
	}
}
