package router

import (
	"testing"

	"github.com/troupe-run/troupe/core"
)

func TestPermanentClassifiesRoutingReasons(t *testing.T) {
	t.Parallel()
	for r, want := range map[core.Reason]bool{
		core.ReasonTopicUnmapped:         true,
		core.ReasonPreferredPoolUnmapped: true,
		core.ReasonRequiresUnsatisfied:   true,
		core.ReasonNoWorkers:             false,
		core.ReasonPoolOverloaded:        false,
		core.ReasonStaleWorker:           false,
		core.ReasonTenantLimit:           false,
		core.ReasonDispatchFailed:        false,
		core.Reason("added_later"):       false,
	} {
		if got := Permanent(r); got != want {
			t.Errorf("Permanent(%s) = %v, want %v", r, got, want)
		}
	}
}
