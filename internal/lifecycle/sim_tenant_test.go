package lifecycle

import (
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
)

// The simulator's model of tenant slots beyond the admit script
// (sim_model_test.go): the node's repair of tenant slots
// (store.RepairTenantSlots with the due poller's housekeeping), and the
// tenant limit as an invariant.

// simTenantRepairEvery: how often the repair runs while a node is up.
const simTenantRepairEvery = 30 * time.Second

// tenantRepair is the node's repair of tenant slots: a holder whose slot is
// older than a minute (recovery.TenantSlotGrace) and whose job is not
// DISPATCHED or RUNNING (or has no record) is freed. It runs from check,
// at most every simTenantRepairEvery, drawing nothing from the seed's
// randomness, so that seeds keep their course.
func (s *sim) tenantRepair() {
	if s.now.Before(s.tenantRepairAt) {
		return
	}
	s.tenantRepairAt = s.now.Add(simTenantRepairEvery)
	if len(s.aliveNodes()) == 0 {
		return
	}
	cutoff := s.now.Add(-time.Minute).UnixMilli()
	for _, id := range sortedKeys(s.tenant) {
		if s.tenantAt[id] > cutoff {
			continue
		}
		if r := s.recs[id]; r != nil && (r.state == jobstate.StateDispatched || r.state == jobstate.StateRunning) {
			continue
		}
		s.logf("repair frees the tenant slot of %s", id)
		delete(s.tenant, id)
		delete(s.tenantAt, id)
		s.tenantRepaired++
	}
}

// checkTenants: the limited tenant has no more jobs with a worker
// (RUNNING in their records, or DISPATCHED with the dispatch sent: a
// DISPATCHED record whose write's reply is still on its way, or that the
// core withheld, reached no worker) than its limit. A record Redis lost and the job's actor
// wrote again (state_lost) as with a worker is left out until the job is
// dispatched again: the job took no slot for it (see checkKeys).
func (s *sim) checkTenants() {
	limit := s.cfg.TenantLimit("limited")
	var holders []string
	for _, id := range s.jobs {
		r := s.recs[id]
		if r == nil || r.state != jobstate.StateDispatched && r.state != jobstate.StateRunning ||
			r.state == jobstate.StateDispatched && (s.withheld[id] || s.sentHop[id] != s.dispatchHops[id]) || s.lostActive[id] || s.slotLost[id] || s.submittedTenant(id) != "limited" {
			continue
		}
		holders = append(holders, id+" "+string(r.state))
	}
	if len(holders) > limit {
		s.fail("tenant limited: %d jobs with a worker (%s), limit %d", len(holders), strings.Join(holders, ", "), limit)
	}
}

// submittedTenant is the tenant the job was submitted for.
func (s *sim) submittedTenant(id string) string {
	for _, d := range s.subs[id] {
		if sub, ok := d.ev.(*Submit); ok {
			return sub.Req.GetTenantId()
		}
	}
	return ""
}

// newTenantSim is newSim with about a quarter of the jobs submitted for
// the limited tenant (limit 2), so that its slots are contended.
func newTenantSim(t testing.TB, seed uint64) *sim {
	s := newSim(t, seed)
	s.tenants = true
	return s
}

// TestTenantLimitSim runs the simulator with the limited tenant's slots
// contended over TROUPE_SIM_TENANT_SEEDS seeds (default 60, from
// TROUPE_SIM_TENANT_FIRST): the tenant never has more jobs with a worker
// than its limit, the repair of its slots and the faults notwithstanding,
// and, once calm, every job ends.
func TestTenantLimitSim(t *testing.T) {
	t.Parallel()
	seeds, steps := envInt("TROUPE_SIM_TENANT_SEEDS", 60), envInt("TROUPE_SIM_STEPS", simMaxSteps)
	first := uint64(envInt("TROUPE_SIM_TENANT_FIRST", 1))
	stale, repaired := 0, 0
	for seed := first; seed < first+uint64(seeds); seed++ {
		s := newTenantSim(t, seed)
		s.run(steps)
		if len(s.failures) > 0 {
			t.Fatalf("seed %d (replay: TROUPE_SIM_TENANT_FIRST=%d TROUPE_SIM_TENANT_SEEDS=1):\n  %s\nlast events:\n  %s", seed, seed,
				strings.Join(s.failures[:min(len(s.failures), 5)], "\n  "),
				strings.Join(s.trace[max(0, len(s.trace)-envInt("TROUPE_SIM_TRACE", 40)):], "\n  "))
		}
		stale += s.tenantStale
		repaired += s.tenantRepaired
	}
	t.Logf("%d seeds: %d dispatches withheld on a stale tenant slot, %d tenant slots freed by the repair", seeds, stale, repaired)
	if seeds >= 20 && repaired == 0 {
		t.Fatalf("the repair never freed a tenant slot: the race was not exercised")
	}
}

// simTenantRegressions are tenant simulator seeds that once broke an
// invariant, named after the defect they caught; each runs in every `go
// test` of the package.
var simTenantRegressions = []struct {
	name string
	seed uint64
	// open, when set, is a defect not fixed yet: the seed is skipped with
	// it until the fix, which removes it.
	open string
}{
	// A dispatch write landed after a clock jump longer than the repair's
	// minute; the repair had freed the job's tenant slot meanwhile (no
	// record yet) and another job took it: three jobs of a limit-2 tenant
	// with workers (before TenantSlotFresh).
	{"DispatchWrittenLongAfterItsTenantSlotIsNotPublished", 32, ""},
	// Redis lost its data (the tenant's slots with it) between a job's
	// admission and its dispatch; the job's actor wrote its record back
	// (state_lost, SCHEDULED) and dispatched on the slot it remembered.
	{"SlotLostWithRedisIsAskedForAgain", 2, ""},
	// The checker's fault: a DISPATCHED record whose request had not been
	// sent to any worker (its write's reply still on its way, or its
	// writer dead before the reply and the record adopted since) was
	// counted as a job with a worker.
	{"DispatchRecordNotSentIsLeftOutOfTheLimit", 217, ""},
	{"DispatchRecordOfADeadWriterNotSentIsLeftOutOfTheLimit", 167, ""},
	// Redis lost its data (a job's tenant slot with it) between the job's
	// admission and its create-and-dispatch write, which no actor can see:
	// the limit is not kept across such a loss (README), and the checker
	// leaves the job out until its next dispatch.
	{"SlotLostWithRedisBeforeTheFirstDispatchIsLeftOutOfTheLimit", 322, ""},
	// The checker's fault: the same, for a job whose record an actor had
	// written back (state_lost) before the loss; the actor that dispatched
	// it after the loss did not know of it (seed 2070 of the tenant soak).
	{"SlotLostWithRedisOfAJobWrittenBackBeforeIsLeftOutOfTheLimit", 2070, ""},
	// The same, the admission and the loss at the same instant (seed 2107:
	// losses are counted, not timed).
	{"SlotLostWithRedisAtItsAdmissionsInstantIsLeftOutOfTheLimit", 2107, ""},
	// The code's fault: a job that asked again for the slot it held (its
	// record adopted SCHEDULED, or back from a lost worker) kept the
	// slot's score from its first take, while its actor timed the
	// dispatch from the new ask (TenantSlotFresh); the repair freed the
	// slot seconds after the ask, another job took it, and the dispatch,
	// fresh by its ask, was published: three jobs of a limit-2 tenant with
	// workers. admit.lua now moves a held slot's score to the ask. Seed
	// 3100 failed so on branch sim541 (job-30's slot, its withheld dispatch
	// then resent by an adopter); after main's merge its course differs
	// and it passes either way. Seed 4075 fails so on main before the fix
	// (job-32 re-asked at 00:19:38 for a slot taken at 00:18:36, the repair
	// freed it at 00:19:56, job-28 took it).
	{"TenantSlotAskedAgainAgesFromTheAsk", 3100, ""},
	{"TenantSlotAskedAgainAgesFromTheAskOnMain", 4075, ""},
	// The code's fault: job-6 asked for its slot at 00:00:00.043 and its
	// node paused with the create-and-dispatch write in flight; a clock
	// jump let the repair free the slot (no record yet) and job-0 took it;
	// the write landed (DISPATCHED, tslot 1) and n2 adopted the record at
	// 00:01:42; n1's reply at 00:01:45 found the slot stale and withheld
	// the dispatch, but the adopter, unaware, resent it on a result stream
	// reset (ResultsLost: "asking the worker again"): three jobs with
	// workers. The dispatch write now records when the job asked for its
	// slots (tsat, ksat) and its script when it landed (dat, Redis's
	// TIME); the adopter withholds a dispatch that landed AdoptedSlotStale
	// after its ask (adoptedSlotStale).
	{"AdoptedDispatchOnAStaleSlotIsResent", 837, ""},
	// The code's fault, found once the model's adopted record carried its
	// state ("s", as activate.lua's does: the adopter's tslot counts only
	// with it): job-10's attempt 1 ran on w0 (record runner w0); its retry
	// was adopted in SCHEDULED and dispatched on the pool subject with w3
	// picked. The adopter took the record's runner, attempt 1's, for the
	// new dispatch's (runner == worker had been w0 == w0), so w3's loss
	// began the worker-lost grace although NATS had given the job to w2;
	// the grace ran out and attempt 2 was retried as worker_lost while w2
	// ran it (and succeeded). A dispatch now makes its runner unknown
	// (runner cleared in the record, runnerKnown in the actor), and an
	// adopter trusts a record's runner only while the job is with it.
	{"RetriedAttemptDoesNotInheritItsRunner", 2653, ""},
}

func TestTenantLimitSimRegressions(t *testing.T) {
	for _, r := range simTenantRegressions {
		t.Run(r.name, func(t *testing.T) {
			if r.open != "" {
				t.Skip(r.open)
			}
			s := newTenantSim(t, r.seed)
			s.run(simMaxSteps)
			if len(s.failures) > 0 {
				t.Errorf("seed %d:\n  %s\nlast events:\n  %s", r.seed,
					strings.Join(s.failures[:min(len(s.failures), 5)], "\n  "),
					strings.Join(s.trace[max(0, len(s.trace)-40):], "\n  "))
			}
		})
	}
}

// tenantDispatch notes a dispatch written for a job of the limited tenant
// that holds no slot because Redis lost it (with all its data) after the
// job took it: the limit is not kept across such a loss (README, tenant
// limits), so checkTenants leaves the job out until it is dispatched
// again. A dispatch with no slot and no such loss stays counted, and so
// does one whose actor wrote the record back after the loss (it knew).
func (s *sim) tenantDispatch(id string) {
	delete(s.slotLost, id)
	admitted, ok := s.admittedIn[id]
	if s.submittedTenant(id) == "limited" && !s.tenant[id] && ok && admitted < s.losses && s.rewrittenIn[id] < s.losses {
		s.slotLost[id] = true
	}
}
