package troupe

import (
	"testing"

	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/recovery"
)

// The repair of key slots frees a slot only once it is older than a
// dispatch the core still publishes may be (lifecycle.KeySlotFresh), with
// room to spare for clocks that differ between replicas: a dispatch that
// landed after such a repair is never published.
func TestConcurrencyKeyRepairWaitsOutAFreshDispatch(t *testing.T) {
	if keySlotGrace < 2*lifecycle.KeySlotFresh {
		t.Fatalf("key slots are repaired after %s; a dispatch is published up to %s after its slot was asked for",
			keySlotGrace, lifecycle.KeySlotFresh)
	}
}

// The same for tenant slots: their repair waits out a dispatch the core
// still publishes (lifecycle.TenantSlotFresh), twice over.
func TestTenantSlotRepairWaitsOutAFreshDispatch(t *testing.T) {
	if recovery.TenantSlotGrace < 2*lifecycle.TenantSlotFresh {
		t.Fatalf("tenant slots are repaired after %s; a dispatch is published up to %s after its slot was asked for",
			recovery.TenantSlotGrace, lifecycle.TenantSlotFresh)
	}
}
