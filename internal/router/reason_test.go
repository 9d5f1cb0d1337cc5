package router

import (
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/lifecycle"
)

func TestPermanentClassifiesRoutingReasons(t *testing.T) {
	t.Parallel()
	for r, want := range map[jobstate.Reason]bool{
		jobstate.ReasonTopicUnmapped:         true,
		jobstate.ReasonPreferredPoolUnmapped: true,
		jobstate.ReasonRequiresUnsatisfied:   true,
		jobstate.ReasonNoWorkers:             false,
		jobstate.ReasonPoolOverloaded:        false,
		jobstate.ReasonStaleWorker:           false,
		jobstate.ReasonTenantLimit:           false,
		jobstate.ReasonDispatchFailed:        false,
		jobstate.Reason("added_later"):       false,
	} {
		if got := lifecycle.Permanent(r); got != want {
			t.Errorf("Permanent(%s) = %v, want %v", r, got, want)
		}
	}
}
