package troupe

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// component is one long-lived part of a node. Start brings it up — and
// registers its own metrics and NATS subscriptions — or fails having left
// nothing running; Stop ends what Start began, bounded by ctx where it
// waits. The node starts its components in a declared order (Node.parts)
// and stops them in the reverse order.
type component interface {
	Name() string
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// part is the adapter through which a node's long-lived parts are
// components: a name, and the start and stop of the part (either nil:
// nothing to do).
type part struct {
	name  string
	start func(ctx context.Context) error
	stop  func(ctx context.Context) error
}

func (p part) Name() string { return p.name }

func (p part) Start(ctx context.Context) error {
	if p.start == nil {
		return nil
	}
	return p.start(ctx)
}

func (p part) Stop(ctx context.Context) error {
	if p.stop == nil {
		return nil
	}
	return p.stop(ctx)
}

// stopOnly is a part with nothing to start.
func stopOnly(name string, stop func(ctx context.Context) error) part {
	return part{name: name, stop: stop}
}

// runState is where a node's components are.
type runState int

const (
	runNew runState = iota
	runStarting
	runStarted
	runFailed  // a Start failed (what had started is stopped)
	runStopped // Stop ran
)

// errNotStartable is returned by Node.Start on a node that was started
// before (a node starts once: after a failed Start or a Stop, build a new
// one with NewNode).
var errNotStartable = errors.New("troupe: node already started, failed to start or stopped; build a new node")

// components runs a node's components: in order, and in reverse order.
type components struct {
	mu      sync.Mutex
	state   runState
	started []component // in start order
	// stopAsked: Stop was called while Start ran; Start stops at the next
	// component and closes startDone, which Stop waits for.
	stopAsked bool
	startDone chan struct{}
	// stopDone is closed when the first stop has stopped everything; later
	// calls wait for it.
	stopDone chan struct{}

	// Tests: failStart names a component whose Start fails (before it
	// runs); record, when set, hears "start <name>" and "stop <name>".
	failStart string
	record    func(event string)
}

// start runs Start on each of list in order. On the first error it stops
// what had started, in reverse order, and returns that error naming the
// component; the components cannot be started again.
func (cs *components) start(ctx context.Context, list []component, stopCtx func() (context.Context, context.CancelFunc)) error {
	cs.mu.Lock()
	if cs.state != runNew {
		cs.mu.Unlock()
		return errNotStartable
	}
	cs.state = runStarting
	cs.startDone = make(chan struct{})
	defer close(cs.startDone)
	cs.mu.Unlock()
	for _, c := range list {
		err := ctx.Err()
		cs.mu.Lock()
		if err == nil && cs.stopAsked {
			err = errors.New("the node was stopped while it started")
		}
		cs.mu.Unlock()
		if err == nil && cs.failStart == c.Name() {
			err = errors.New("failure injected by a test")
		}
		if err == nil {
			err = c.Start(ctx)
		}
		if err != nil {
			err = fmt.Errorf("troupe: start %s: %w", c.Name(), err)
			sctx, cancel := stopCtx()
			_ = cs.stopAll(sctx)
			cancel()
			cs.mu.Lock()
			cs.state = runFailed
			cs.mu.Unlock()
			return err
		}
		cs.mu.Lock()
		cs.started = append(cs.started, c)
		cs.mu.Unlock()
		if cs.record != nil {
			cs.record("start " + c.Name())
		}
	}
	cs.mu.Lock()
	cs.state = runStarted
	cs.mu.Unlock()
	return nil
}

// stop stops the started components in reverse order, once: a later call
// waits for the first to end and returns nil. Called while start runs, it
// makes start stop before its next component and waits for it.
func (cs *components) stop(ctx context.Context) error {
	cs.mu.Lock()
	if cs.state == runStarting {
		cs.stopAsked = true
		done := cs.startDone
		cs.mu.Unlock()
		<-done
		cs.mu.Lock()
	}
	if cs.state == runStopped {
		done := cs.stopDone
		cs.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
		}
		return nil
	}
	if cs.state == runFailed {
		cs.mu.Unlock()
		return nil
	}
	cs.state = runStopped
	cs.stopDone = make(chan struct{})
	defer close(cs.stopDone)
	cs.mu.Unlock()
	return cs.stopAll(ctx)
}

func (cs *components) stopAll(ctx context.Context) error {
	cs.mu.Lock()
	started := cs.started
	cs.started = nil
	cs.mu.Unlock()
	var errs []error
	for i := len(started) - 1; i >= 0; i-- {
		c := started[i]
		if err := c.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("troupe: stop %s: %w", c.Name(), err))
		}
		if cs.record != nil {
			cs.record("stop " + c.Name())
		}
	}
	return errors.Join(errs...)
}
