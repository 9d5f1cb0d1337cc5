package troupe

import (
	"github.com/troupe-run/troupe/internal/jobdata"
	"github.com/troupe-run/troupe/safety"
)

// JobData is the store of job inputs and results on the node's Redis, as
// CAP's convention places them (package jobdata): values written through
// it expire jobdata.TTLFor(Config.Retention) after the write (never, when
// records are kept for ever).
func (n inspector) JobData() *jobdata.Store {
	ttl := jobdata.TTLFor(n.store.Retention())
	if ttl == 0 {
		ttl = -1
	}
	return &jobdata.Store{Client: n.rdb, TTL: ttl}
}

// OutputChecker is the node's output policy (Config.Output; nil: none).
// The admin API applies it to the result data it shows.
func (n inspector) OutputChecker() safety.OutputChecker { return n.cfg.Output }
