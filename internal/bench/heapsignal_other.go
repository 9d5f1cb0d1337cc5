//go:build !unix

package bench

import (
	"context"
	"log/slog"
)

// heapProfilesOnSignal: no SIGUSR1 here.
func heapProfilesOnSignal(context.Context, string, *slog.Logger) (stop func()) { return func() {} }
