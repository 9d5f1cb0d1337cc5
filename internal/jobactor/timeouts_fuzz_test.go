package jobactor_test

import (
	"testing"

	"github.com/troupe-run/troupe/internal/jobactor"
)

// No timeouts.yaml makes the parser panic; an accepted one has positive timeouts.
func FuzzParseTimeouts(f *testing.F) {
	for _, seed := range []string{
		"reconciler:\n  dispatch_timeout_seconds: 300\n  running_timeout_seconds: 9000\n",
		"topics:\n  job.x:\n    timeout_seconds: 5\n", "reconciler: 5\n", "", "topics: [1,2]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tm, err := jobactor.ParseTimeouts(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("rejection without a reason")
			}
			return
		}
		if tm.Dispatch <= 0 || tm.Running <= 0 {
			t.Fatalf("accepted non-positive timeouts: %+v", tm)
		}
		for topic, d := range tm.PerTopic {
			if d <= 0 {
				t.Fatalf("topic %q timeout %v", topic, d)
			}
		}
	})
}
