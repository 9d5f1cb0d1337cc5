package worker

// StaleDropped counts the dispatches dropped as stale.
func (w *Worker) StaleDropped() uint64 { return w.stale.Load() }

// Beat publishes a heartbeat now.
func (w *Worker) Beat() { w.beat() }
