//go:build unix

package bench

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// logLines sends each log line written to it.
type logLines chan string

func (l logLines) Write(b []byte) (int, error) { l <- string(b); return len(b), nil }

// With HeapDirEnv's directory given, each SIGUSR1 writes one heap profile
// there (gzipped, as pprof writes them), the n-th named heap-<pid>-<n>.prof.
func TestHeapProfileOnSIGUSR1(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := make(logLines, 4)
	stop := heapProfilesOnSignal(ctx, dir, slog.New(slog.NewTextHandler(lines, nil)))
	defer stop()
	for n := 1; n <= 2; n++ {
		if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		select {
		case l := <-lines:
			t.Log(l)
		case <-time.After(30 * time.Second):
			t.Fatalf("no heap profile %d written 30 s after SIGUSR1", n)
		}
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("heap-%d-%d.prof", os.Getpid(), n)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
			t.Fatalf("profile %d: %d bytes, not gzipped", n, len(b))
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.tmp")); len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}
