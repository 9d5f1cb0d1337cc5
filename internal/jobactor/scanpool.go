package jobactor

// ScanPool runs output content scans (phase 2) on a fixed number of
// goroutines with a bounded queue, so a burst of results cannot start an
// unbounded number of 30-second scans. A full queue skips the scan (it is
// counted): the result was already released by phase 1.
type ScanPool struct {
	work chan func()
	done chan struct{}
}

// NewScanPool starts workers goroutines with a queue of queue scans.
func NewScanPool(workers, queue int) *ScanPool {
	p := &ScanPool{work: make(chan func(), queue), done: make(chan struct{})}
	for i := 0; i < workers; i++ {
		go func() {
			for {
				select {
				case fn := <-p.work:
					fn()
				case <-p.done:
					return
				}
			}
		}()
	}
	return p
}

// Go queues fn, or reports false if the queue is full.
func (p *ScanPool) Go(fn func()) bool {
	select {
	case p.work <- fn:
		return true
	default:
		return false
	}
}

// Stop ends the workers; queued scans are dropped.
func (p *ScanPool) Stop() { close(p.done) }
