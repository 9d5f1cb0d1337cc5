package lifecycle

import (
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// fieldOf is field name's value among a transition's fields (ok: present).
func fieldOf(t *jobstate.Transition, name string) (string, bool) {
	for i := 0; i+1 < len(t.Fields); i += 2 {
		if t.Fields[i] == name {
			return t.Fields[i+1], true
		}
	}
	return "", false
}

// A dispatch on a tenant slot records when the job asked for it (tsat,
// the node's clock) and asks its script to stamp its landing (dat); one on
// a key slot, when it asked for that (ksat).
func TestTenantLimitDispatchRecordsItsSlotAsk(t *testing.T) {
	d := newDriver(t)
	d.j.cfg.TenantLimit = func(string) int { return 1 }
	d.j.cfg.KeyLimit = func(string) (int, string) { return 1, KeyQueue }
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x", TenantId: "t",
		Meta: &capv1.JobMetadata{Labels: map[string]string{LabelConcurrencyKey: "k"}}}})
	d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	asked := d.now
	d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	d.now = d.now.Add(time.Second)
	fx := d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Admitted: true}})
	ask, ok := find[AskKeySlot](fx)
	if !ok {
		t.Fatalf("no key slot asked for: %v", fx)
	}
	d.feed(&KeySlotDone{Epoch: ask.Epoch, Outcome: KeyAdmitted})
	w, ok := find[*Write](d.fx)
	if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateDispatched {
		t.Fatalf("no dispatch write: %v", d.fx)
	}
	tsat, _ := fieldOf(w.Op.T, fieldTenantAsked)
	ksat, _ := fieldOf(w.Op.T, fieldKeyAsked)
	dat, _ := fieldOf(w.Op.T, jobstate.FieldLanded)
	if tsat != strconv.FormatInt(asked.UnixMilli(), 10) || ksat != strconv.FormatInt(d.now.UnixMilli(), 10) ||
		dat != jobstate.LandedNow {
		t.Fatalf("dispatch fields tsat %q ksat %q dat %q; want %d, %d and the landing stamp", tsat, ksat, dat,
			asked.UnixMilli(), d.now.UnixMilli())
	}
}

// adoptDispatched adopts a DISPATCHED record of job-1 (tenant t, limit 1;
// key k, limit 1) written by another node, with extra fields, and returns
// the adoption's effects.
func adoptDispatched(t *testing.T, extra ...string) (*driver, []Effect) {
	d := newDriver(t)
	d.j.cfg.TenantLimit = func(string) int { return 1 }
	d.j.cfg.KeyLimit = func(string) (int, string) { return 1, KeyQueue }
	d.j.cfg.ResendAfter = time.Second
	req, _ := jobstate.EncodeRequest(&capv1.JobRequest{JobId: "job-1", Topic: "job.x", TenantId: "t",
		Meta: &capv1.JobMetadata{Labels: map[string]string{LabelConcurrencyKey: "k"}}})
	f := map[string]string{"s": "DISPATCHED", "reason": string(jobstate.ReasonDispatched), "worker": "w0",
		"subj": "worker.w0.jobs", "resend": "1", "req": string(req),
		"deadline": strconv.FormatInt(d.now.Add(time.Hour).UnixMilli(), 10), "deadline_kind": "dispatch_timeout"}
	for i := 0; i+1 < len(extra); i += 2 {
		f[extra[i]] = extra[i+1]
	}
	d.feed(&Wake{})
	return d, d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateAdopted, State: jobstate.StateDispatched,
		Fence: 2, Holder: "", Fields: f}})
}

func msAgo(d *driver, ago time.Duration) string {
	return strconv.FormatInt(d.now.Add(-ago).UnixMilli(), 10)
}

// The adopter of a DISPATCHED record that landed AdoptedSlotStale or more
// after its job asked for its tenant slot withholds the dispatch, as its
// first owner did on the write's reply (TenantSlotFresh), or would have:
// the repair may have given the slot away before the write landed (seed
// 837). The job goes back to SCHEDULED (tenant_limit), giving the slot
// back, and sends the worker nothing. A record that landed sooner is
// adopted as before, its dispatch resent to a deduping worker.
func TestTenantLimitAdopterWithholdsADispatchThatLandedLongAfterItsAsk(t *testing.T) {
	probe := newDriver(t)
	landed := msAgo(probe, time.Minute)
	_, fx := adoptDispatched(t, "tslot", "1", fieldTenantAsked, msAgo(probe, time.Minute+AdoptedSlotStale-time.Second),
		jobstate.FieldLanded, landed)
	if _, ok := find[*Write](fx); ok {
		t.Fatalf("a dispatch that landed %s after its ask was taken back: %v", AdoptedSlotStale-time.Second, fx)
	}

	d, fx := adoptDispatched(t, "tslot", "1", fieldTenantAsked, msAgo(probe, time.Minute+AdoptedSlotStale),
		jobstate.FieldLanded, landed)
	w, ok := find[*Write](fx)
	if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateScheduled ||
		w.Op.T.Path[0].Reason != jobstate.ReasonTenantLimit || w.Op.TenantRelease != "t" {
		t.Fatalf("the adopted stale dispatch was not taken back to SCHEDULED (tenant_limit), its slot given back: %v", fx)
	}
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	d.now = d.now.Add(time.Minute)
	fx = append(fx, d.feed(&ResultsLost{})...)
	if _, ok := find[*PublishRequest](fx); ok {
		t.Fatalf("the withheld dispatch was sent: %v", fx)
	}
	if d.j.State != jobstate.StateScheduled || d.j.admitted {
		t.Fatalf("state %s, slot held %v after the stale dispatch was taken back", d.j.State, d.j.admitted)
	}
	fx = d.feed(&Timer{Epoch: d.timer})
	if _, ok := find[*AskRouter](fx); !ok {
		t.Fatalf("the withheld job asked for no worker: %v", fx)
	}
	fx = d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	if w, ok := find[*Write](fx); !ok || w.Op.Kind != OpAdmit {
		t.Fatalf("the withheld job asked for no tenant slot: %v", fx)
	}
}

// The same for a key slot (ksat): the adopter withholds (concurrency_key)
// and asks for the key's slot again.
func TestConcurrencyKeyAdopterWithholdsADispatchThatLandedLongAfterItsAsk(t *testing.T) {
	probe := newDriver(t)
	landed := msAgo(probe, time.Minute)
	_, fx := adoptDispatched(t, "ckey", "k", fieldKeyAsked, msAgo(probe, time.Minute+AdoptedSlotStale-time.Second),
		jobstate.FieldLanded, landed)
	if _, ok := find[*Write](fx); ok {
		t.Fatalf("a dispatch that landed %s after its ask was taken back: %v", AdoptedSlotStale-time.Second, fx)
	}

	d, fx := adoptDispatched(t, "ckey", "k", fieldKeyAsked, msAgo(probe, time.Minute+AdoptedSlotStale),
		jobstate.FieldLanded, landed)
	w, ok := find[*Write](fx)
	if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateScheduled ||
		w.Op.T.Path[0].Reason != jobstate.ReasonConcurrencyKey {
		t.Fatalf("the adopted stale dispatch was not taken back to SCHEDULED (concurrency_key): %v", fx)
	}
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	d.now = d.now.Add(time.Minute)
	fx = d.feed(&Timer{Epoch: d.timer})
	if _, ok := find[*AskRouter](fx); !ok {
		t.Fatalf("the withheld job asked for no worker: %v", fx)
	}
	d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "worker.w1.jobs"})
	fx = d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Admitted: true}}) // its tenant's slot
	if _, ok := find[AskKeySlot](fx); !ok {
		t.Fatalf("the withheld job asked for no key slot: %v", fx)
	}
}

// A record with no slot asks (written before them, or by a job with no
// limit) is adopted as before, however old its landing; so is a RUNNING
// one.
func TestTenantLimitAdopterKeepsADispatchWithNoSlotAsk(t *testing.T) {
	probe := newDriver(t)
	for _, extra := range [][]string{
		{"tslot", "1"},
		{"tslot", "1", fieldTenantAsked, "", fieldKeyAsked, "", jobstate.FieldLanded, msAgo(probe, 0)},
		{"tslot", "1", jobstate.FieldLanded, msAgo(probe, 0)},
	} {
		if _, fx := adoptDispatched(t, extra...); len(fx) > 0 {
			if _, ok := find[*Write](fx); ok {
				t.Fatalf("record with %v: the adopter wrote %v", extra, fx)
			}
		}
	}
}

// A new dispatch's runner is unknown: a retried attempt dispatched on a
// pool subject clears the record's runner (attempt 1's), so that neither
// this actor nor an adopter takes the picked worker for the one running it
// (seed 2653: a picked worker's loss began the worker-lost grace, and the
// attempt was retried, while NATS had given it to another worker).
func TestRetryPolicyRetriedAttemptDoesNotInheritItsRunner(t *testing.T) {
	d := newDriver(t)
	req, _ := jobstate.EncodeRequest(&capv1.JobRequest{JobId: "job-1", Topic: "job.x"})
	d.feed(&Wake{})
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateAdopted, State: jobstate.StateScheduled, Fence: 2,
		Fields: map[string]string{"s": "SCHEDULED", "reason": string(jobstate.ReasonRetryWait), "worker": "w0",
			"runner": "w0", jobstate.FieldTry: "2", "req": string(req)}}})
	if d.j.runnerKnown {
		t.Fatal("an adopted SCHEDULED record's runner (an earlier attempt's) taken as known")
	}
	// w0 again, a stock worker (no progress: started on delivery).
	fx := d.feed(&PickReply{Epoch: d.step, WorkerID: "w0", Subject: "job.x", Pool: "p", StartsOnDelivery: true})
	w, ok := find[*Write](fx)
	if !ok || w.Op.T == nil || w.Op.T.Final() != jobstate.StateDispatched {
		t.Fatalf("no dispatch write: %v", fx)
	}
	if v, ok := fieldOf(w.Op.T, "runner"); !ok || v != "" {
		t.Fatalf("the dispatch over an existing record left its runner (runner %q, written %v)", v, ok)
	}
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	fx = d.feed(&WorkerLost{WorkerID: "w0"})
	if w, ok := find[*Write](fx); ok && w.Op.T != nil && w.Op.T.Path[0].Reason == jobstate.ReasonWorkerLost {
		t.Fatalf("the picked worker's loss began the worker-lost grace of a job NATS may have given to another: %v", fx)
	}
}
