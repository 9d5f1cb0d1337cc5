package lifecycle

import (
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// lockValue is jobstate.LockValue for every node and fence, nodes taking
// turns included, and joins nothing for a node's fence-1 locks once made.
func TestLockValueIsJobstateLockValue(t *testing.T) {
	for _, node := range []string{"n1", "n2", "n1", "", "n1|x", "n2"} {
		for _, fence := range []int64{1, 0, 2, 1, 12345678901, -1, 1} {
			if got, want := lockValue(node, fence), jobstate.LockValue(node, fence); got != want {
				t.Errorf("lockValue(%q, %d) = %q, want %q", node, fence, got, want)
			}
		}
	}
	lockValue("n3", 1)
	if n := testing.AllocsPerRun(100, func() { _ = lockValue("n3", 1) }); n != 0 {
		t.Errorf("a node's fence-1 lock value allocates %v, want 0", n)
	}
}
