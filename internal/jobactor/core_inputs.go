package jobactor

import (
	"context"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/outputgate"
	"github.com/troupe-run/troupe/internal/policyenv"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/signing"
)

// What the core takes from the policy engine, the saga package and the
// key set, computed here: the core imports none of them (see
// lifecycle.Sender, PolicyDone.Record, OutputOutcome, Config.Saga).

// principal is a signing principal as the core's Sender.
type principal signing.Principal

func (p *principal) WorkerKey() bool              { return p.Role == signing.RoleWorker }
func (p *principal) InPool(pool string) bool      { return (*signing.Principal)(p).InPool(pool) }
func (p *principal) ForTenant(tenant string) bool { return (*signing.Principal)(p).ForTenant(tenant) }

// By is the core's Sender for a verified principal (nil: the node does not
// verify senders). It allocates nothing.
func By(p *signing.Principal) lifecycle.Sender {
	if p == nil {
		return nil
	}
	return (*principal)(p)
}

// policyDone is the input policy's answer as the core takes it.
func policyDone(epoch uint64, dec *capv1.PolicyCheckResponse, err error) *lifecycle.PolicyDone {
	m := &lifecycle.PolicyDone{Epoch: epoch, Dec: dec, Err: err}
	if err == nil && dec != nil {
		m.Record = policyenv.DecisionFields(dec)
		if dec.Decision == capv1.DecisionType_DECISION_TYPE_ALLOW_WITH_CONSTRAINTS {
			c := dec.Constraints
			m.Constrain = func(req *capv1.JobRequest) { policyenv.ApplyConstraints(req, c) }
		}
	}
	return m
}

// allowAllDec and allowAllRecord are safety.AllowAll's answer and its
// record fields, made once: AllowAll gives every request the same answer
// and reads nothing of it, and the core only reads both (allowAllDone).
var allowAllDec, allowAllRecord = func() (*capv1.PolicyCheckResponse, []string) {
	dec, _ := safety.AllowAll{}.Check(context.Background(), nil)
	return dec, slices.Clip(policyenv.DecisionFields(dec))
}()

// allowAllDone is policyDone for safety.AllowAll's answer, with no check
// request built, no answer and no record fields made for each job. The
// record's cap is its length: an append copies it.
func allowAllDone(epoch uint64) lifecycle.PolicyDone {
	return lifecycle.PolicyDone{Epoch: epoch, Dec: allowAllDec, Record: allowAllRecord}
}

// outputOutcome is phase 1's outcome as the core takes it.
func outputOutcome(o outputgate.Outcome) lifecycle.OutputOutcome {
	return lifecycle.OutputOutcome{Phase: o.Phase, Quarantine: o.Quarantine, ResultPtr: o.ResultPtr,
		Redacted: o.Redacted, Reason: o.Reason, RuleID: o.RuleID, ContentChecked: o.ContentChecked,
		Fields: o.Fields()}
}

// sagaRecorder is the core's Config.Saga: a succeeded step with a
// compensation records its template next to its workflow's stack and joins
// the stack; a step failed fatally triggers the workflow's rollback. The
// keys expire retention after the write (see saga.RecordStep), not with the
// step's record. A compensation is not a step of its workflow: it records
// nothing and, failing, does not roll the workflow back again.
func sagaRecorder(retention time.Duration) func(*jobstate.Transition, *capv1.JobRequest, string, time.Time, bool) {
	return func(t *jobstate.Transition, req *capv1.JobRequest, jobID string, now time.Time, failed bool) {
		wf := req.GetWorkflowId()
		if wf == "" || req.GetLabels()[saga.LabelIsCompensation] == "true" {
			return
		}
		if failed {
			saga.RecordTrigger(t, wf, now.UnixMilli(), retention)
			return
		}
		tmpl := saga.Template(req)
		if tmpl == nil {
			return
		}
		raw, err := proto.Marshal(tmpl)
		if err != nil {
			return
		}
		saga.RecordStep(t, wf, jobID, req.GetTopic(), raw, now.UnixMilli(), retention)
	}
}

// PrincipalOf is the signing principal behind a Sender that By made (nil
// for nil).
func PrincipalOf(s lifecycle.Sender) *signing.Principal {
	if p, ok := s.(*principal); ok {
		return (*signing.Principal)(p)
	}
	return nil
}
