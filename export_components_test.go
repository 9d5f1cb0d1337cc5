package troupe

import "time"

// FailStartOf makes the node's component name fail to start (before it
// runs), so a test can see what a failed Start leaves behind.
func (n *Node) FailStartOf(name string) { n.comps.failStart = name }

// RecordComponents makes the node tell record of every component start
// ("start <name>") and stop ("stop <name>"), in order.
func (n *Node) RecordComponents(record func(event string)) { n.comps.record = record }

// SetBackoff sets the scheduling retry delay of the node built from c
// (nil: the default, jobactor.Backoff).
func SetBackoff(c *Config, f func(attempt int) time.Duration) { c.backoff = f }

// TuningInUse returns the tuning the node runs with (its Config.Tuning,
// zero fields filled).
func (n *Node) TuningInUse() Tuning { return n.cfg.Tuning }

// StopAsked reports whether Stop was called while Start ran.
func (n *Node) StopAsked() bool {
	n.comps.mu.Lock()
	defer n.comps.mu.Unlock()
	return n.comps.stopAsked
}
