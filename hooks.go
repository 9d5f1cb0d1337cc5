package troupe

import (
	"time"

	"github.com/troupe-run/troupe/internal/testhook"
)

func init() {
	testhook.SetBackoff = func(cfg any, backoff func(attempt int) time.Duration) { cfg.(*Config).backoff = backoff }
}
