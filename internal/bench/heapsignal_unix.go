//go:build unix

package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

// heapProfilesOnSignal writes a heap profile into dir on each SIGUSR1
// until ctx ends or the returned stop is called; dir "" does nothing.
func heapProfilesOnSignal(ctx context.Context, dir string, log *slog.Logger) (stop func()) {
	if dir == "" {
		return func() {}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR1)
	done := make(chan struct{})
	go func() {
		for n := 1; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-ch:
			}
			path := filepath.Join(dir, fmt.Sprintf("heap-%d-%d.prof", os.Getpid(), n))
			err := writeHeapProfile(path + ".tmp")
			if err == nil {
				err = os.Rename(path+".tmp", path) // whole, or not there
			}
			if err != nil {
				log.Warn("bench child: heap profile", "path", path, "err", err)
			} else {
				log.Warn("bench child: heap profile written", "path", path)
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}
