package supervisor

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// OnPool has an actor run on d with a Mailbox: every actor a node spawns
// per job (and its shards) uses it.
func OnPool(d *PoolDispatcher) actor.PropsOption {
	return func(p *actor.Props) {
		actor.WithDispatcher(d)(p)
		actor.WithMailbox(NewMailbox)(p)
	}
}

// Mailbox is protoactor's unbounded mailbox with fewer allocations, for
// actors spawned and stopped once per job. protoactor's own allocates six
// objects per actor (the mailbox, a ring queue and its buffer, a lock-free
// queue and its stub node, a wrapper), one per system message (a queue
// node) and a closure each time it is scheduled (the method value
// m.processMessages, 4.8 times a job). This one allocates itself (with
// room for four queued messages of each kind) and nothing else on a
// PoolDispatcher (it is queued there as itself); on another dispatcher,
// its run function once.
// It keeps protoactor's rules: system messages before user messages;
// SuspendMailbox holds user messages until ResumeMailbox; a run
// yields after the dispatcher's throughput; a panic escalates to the
// invoker as a failure of the message that caused it.
//
// It does not take middlewares (no actor here uses mailbox middleware);
// a MessageBatch is posted as its messages and then itself, as protoactor's
// is.
type Mailbox struct {
	mu      sync.Mutex
	user    msgQueue
	system  msgQueue
	users   atomic.Int32 // user messages queued
	systems atomic.Int32 // system messages queued

	scheduled atomic.Bool // a run is scheduled or running
	suspended atomic.Bool

	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
	// run is m.process, bound once, for a dispatcher other than a
	// PoolDispatcher (a pool's runs are posted as m; the Mailbox stays in
	// its 256-byte size class: no field for the pool).
	run func()
}

// NewMailbox is a MailboxProducer of Mailbox.
func NewMailbox() actor.Mailbox { return &Mailbox{} }

// msgQueue is a FIFO on a slice that is reused once it empties; its first
// slots are its own (a job actor rarely has more than a few messages
// queued), so a queue that stays short allocates nothing.
type msgQueue struct {
	items []interface{}
	head  int
	first [4]interface{}
}

func (q *msgQueue) push(m interface{}) {
	if q.items == nil {
		q.items = q.first[:0]
	}
	q.items = append(q.items, m)
}

func (q *msgQueue) pop() (interface{}, bool) {
	if q.head == len(q.items) {
		return nil, false
	}
	m := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	return m, true
}

// PostUserMessage queues a user message and schedules a run.
func (m *Mailbox) PostUserMessage(message interface{}) {
	if batch, ok := message.(actor.MessageBatch); ok {
		for _, msg := range batch.GetMessages() {
			m.PostUserMessage(msg)
		}
	}
	if env, ok := message.(*actor.MessageEnvelope); ok {
		if batch, ok := env.Message.(actor.MessageBatch); ok {
			for _, msg := range batch.GetMessages() {
				m.PostUserMessage(msg)
			}
		}
	}
	m.mu.Lock()
	m.user.push(message)
	m.mu.Unlock()
	m.users.Add(1)
	m.schedule()
}

// PostSystemMessage queues a system message and schedules a run.
func (m *Mailbox) PostSystemMessage(message interface{}) {
	m.mu.Lock()
	m.system.push(message)
	m.mu.Unlock()
	m.systems.Add(1)
	m.schedule()
}

// RegisterHandlers sets who handles the messages and where runs go.
func (m *Mailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker, m.dispatcher = invoker, dispatcher
	if _, ok := dispatcher.(*PoolDispatcher); !ok {
		m.run = m.process
	}
}

// runOnPool is the Mailbox's run on its PoolDispatcher.
func (m *Mailbox) runOnPool() { m.process() }

// Start does nothing: there are no middlewares to tell.
func (m *Mailbox) Start() {}

// UserMessageCount is how many user messages are queued.
func (m *Mailbox) UserMessageCount() int { return int(m.users.Load()) }

func (m *Mailbox) schedule() {
	if m.scheduled.CompareAndSwap(false, true) {
		if p, ok := m.dispatcher.(*PoolDispatcher); ok {
			p.post(m)
		} else {
			m.dispatcher.Schedule(m.run)
		}
	}
}

// process runs the queued messages, then goes idle unless more came in
// meanwhile and no other run has been scheduled for them.
func (m *Mailbox) process() {
	for {
		m.drain()
		m.scheduled.Store(false)
		if m.systems.Load() == 0 && (m.suspended.Load() || m.users.Load() == 0) {
			return
		}
		if !m.scheduled.CompareAndSwap(false, true) {
			return // a post scheduled its own run
		}
	}
}

// next pops the next message: a system message first; a user message only
// while not suspended.
func (m *Mailbox) next() (msg interface{}, system, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if msg, ok = m.system.pop(); ok {
		return msg, true, true
	}
	if m.suspended.Load() {
		return nil, false, false
	}
	msg, ok = m.user.pop()
	return msg, false, ok
}

func (m *Mailbox) drain() {
	var msg interface{}
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
		}
	}()
	throughput := m.dispatcher.Throughput()
	for i := 0; ; i++ {
		if i > throughput {
			i = 0
			runtime.Gosched()
		}
		var system, ok bool
		if msg, system, ok = m.next(); !ok {
			return
		}
		if system {
			m.systems.Add(-1)
			switch msg.(type) {
			case *actor.SuspendMailbox:
				m.suspended.Store(true)
			case *actor.ResumeMailbox:
				m.suspended.Store(false)
			default:
				m.invoker.InvokeSystemMessage(msg)
			}
			continue
		}
		m.users.Add(-1)
		m.invoker.InvokeUserMessage(msg)
	}
}

var _ actor.Mailbox = (*Mailbox)(nil)
