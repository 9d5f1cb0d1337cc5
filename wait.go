package troupe

import (
	"context"
	"sync"
	"time"

	"github.com/troupe-run/troupe/internal/store"
)

// waitPoll is how often a node looks, in one Redis pipeline for all of its
// waiters, for waited jobs that ended on another replica. Jobs that end on
// this node wake their waiters at once.
const waitPoll = 250 * time.Millisecond

// waiters are the callers of Node.Wait, by job id.
type waiters struct {
	mu   sync.Mutex
	byID map[string][]chan struct{}
	kick chan struct{} // the poller has work
}

func newWaiters() *waiters {
	return &waiters{byID: map[string][]chan struct{}{}, kick: make(chan struct{}, 1)}
}

func (w *waiters) add(id string) chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	w.byID[id] = append(w.byID[id], ch)
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return ch
}

func (w *waiters) remove(id string, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	chs := w.byID[id]
	for i, c := range chs {
		if c == ch {
			chs = append(chs[:i], chs[i+1:]...)
			break
		}
	}
	if len(chs) == 0 {
		delete(w.byID, id)
	} else {
		w.byID[id] = chs
	}
}

// ended wakes the waiters of id (the job is terminal).
func (w *waiters) ended(id string) {
	w.mu.Lock()
	chs := w.byID[id]
	delete(w.byID, id)
	w.mu.Unlock()
	for _, ch := range chs {
		close(ch)
	}
}

func (w *waiters) ids() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, 0, len(w.byID))
	for id := range w.byID {
		out = append(out, id)
	}
	return out
}

// poll wakes, every waitPoll while anyone waits, the waiters of jobs that
// ended on another replica: one pipeline for every waited job.
func (w *waiters) poll(stop <-chan struct{}, st *store.Store) {
	t := time.NewTicker(waitPoll)
	defer t.Stop()
	for {
		ids := w.ids()
		if len(ids) == 0 {
			select {
			case <-stop:
				return
			case <-w.kick:
				continue
			}
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitPoll)
		states, err := st.States(ctx, ids)
		cancel()
		if err != nil {
			continue
		}
		for id, s := range states {
			if s.Terminal() {
				w.ended(id)
			}
		}
	}
}

// Wait returns the record of jobID once the job is terminal, or ctx's error.
// A job that ends on this node wakes its waiters at once; one that ends on
// another replica is seen within waitPoll (one Redis pipeline per poll for
// all of the node's waiters, not a read per waiter). A job that does not
// exist yet is waited for too.
func (n *Node) Wait(ctx context.Context, jobID string) (*Job, error) {
	rec, err := n.waitRecord(ctx, jobID)
	return jobOf(rec), err
}

func (n *Node) waitRecord(ctx context.Context, jobID string) (*store.JobRecord, error) {
	ch := n.waiters.add(jobID)
	defer n.waiters.remove(jobID, ch)
	if rec, err := n.store.GetJob(ctx, jobID); err == nil && rec.State.Terminal() {
		return rec, nil
	}
	select {
	case <-ch:
		return n.store.GetJob(ctx, jobID)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// WaitForWorkers returns once at least count workers of pool are live on
// this node's router, or ctx's error. It asks the router in process (no
// Redis, no network) every 20 ms.
func (n *Node) WaitForWorkers(ctx context.Context, pool string, count int) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if ws, err := (inspector{n}).Workers(); err == nil {
			live := 0
			for _, w := range ws {
				if w.Pool == pool {
					live++
				}
			}
			if live >= count {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
