package worker

// StaleDropped counts the dispatches dropped as stale.
func (w *Worker) StaleDropped() uint64 { return w.stale.Load() }

// Beat publishes a heartbeat now.
func (w *Worker) Beat() { w.beat() }

// Test names of unexported constants.
const (
	CodeBadInput  = codeBadInput
	CodeFailed    = codeFailed
	CodeFailFatal = codeFailFatal
	EnvFail       = envFail
	EnvFatal      = envFatal
	EnvSleep      = envSleep
)
