package supervisor

import (
	"runtime"

	"github.com/asynkron/protoactor-go/actor"
)

// PoolDispatcher runs actor mailboxes on a fixed set of long-lived
// goroutines. protoactor's default dispatcher starts a new goroutine for
// every mailbox run; under load each run then grows a fresh stack, which the
// bench profile measured at 17 % of the node's CPU. A pooled goroutine keeps
// its grown stack from one run to the next.
//
// Schedule never blocks: when every pooled goroutine is busy and the queue
// is full it falls back to a fresh goroutine, so a mailbox run that
// schedules another one cannot deadlock the pool.
//
// Its queue holds poolTasks: a Mailbox of its own is queued as itself,
// so a mailbox needs no func bound to it (a method value, one allocation
// per actor: an actor a job, issue 33 round 12).
type PoolDispatcher struct {
	work       chan poolTask
	done       chan struct{}
	throughput int
}

// PoolDispatcher sizing.
const (
	// PoolWorkersPerCPU: mailbox runs never block on I/O here, so a few
	// goroutines per CPU keep every core busy without piling up.
	PoolWorkersPerCPU = 4
	// PoolQueue is how many scheduled runs may wait for a pooled goroutine.
	PoolQueue = 4096
	// PoolThroughput is messages per mailbox run before it yields
	// (protoactor's default is 300).
	PoolThroughput = 300
)

// NewPoolDispatcher starts the pool.
func NewPoolDispatcher() *PoolDispatcher {
	d := &PoolDispatcher{work: make(chan poolTask, PoolQueue), done: make(chan struct{}), throughput: PoolThroughput}
	for i := 0; i < PoolWorkersPerCPU*runtime.GOMAXPROCS(0); i++ {
		go func() {
			for {
				select {
				case t := <-d.work:
					t.runOnPool()
				case <-d.done:
					return
				}
			}
		}()
	}
	return d
}

// Schedule runs fn on a pooled goroutine (or a new one if all are busy).
func (d *PoolDispatcher) Schedule(fn func()) { d.post(funcTask(fn)) }

// post runs t on a pooled goroutine (or a new one if all are busy).
func (d *PoolDispatcher) post(t poolTask) {
	select {
	case d.work <- t:
	default:
		go t.runOnPool()
	}
}

// poolTask is a run queued on the pool: a scheduled func, or a Mailbox.
type poolTask interface{ runOnPool() }

// funcTask is a func given to Schedule (a func value is one pointer: held
// in the interface without an allocation).
type funcTask func()

func (f funcTask) runOnPool() { f() }

// Throughput is the messages a mailbox run handles before yielding.
func (d *PoolDispatcher) Throughput() int { return d.throughput }

// Close stops the pooled goroutines. Runs scheduled afterwards still run,
// each on a goroutine of its own.
func (d *PoolDispatcher) Close() {
	close(d.done)
	for {
		select {
		case t := <-d.work:
			go t.runOnPool()
		default:
			return
		}
	}
}

var _ actor.Dispatcher = (*PoolDispatcher)(nil)
