package lifecycle

import (
	"slices"
	"testing"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// key is a verified sender as the core sees one (the shell's is the
// node's signing principal, jobactor.By): a worker key serves its pools, a
// client key its tenants, an operator key every tenant.
type key struct {
	role           string // "worker", "client", "operator"
	pools, tenants []string
}

func (k *key) WorkerKey() bool { return k.role == "worker" }
func (k *key) InPool(pool string) bool {
	return k.role == "worker" && slices.Contains(k.pools, pool)
}
func (k *key) ForTenant(tenant string) bool {
	return k.role == "operator" || k.role == "client" && slices.Contains(k.tenants, tenant)
}

func workerKey(_ string, pools ...string) *key { return &key{role: "worker", pools: pools} }

func succeeded(worker string, by Sender) *Result {
	return &Result{Res: &capv1.JobResult{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, WorkerId: worker}, By: by}
}

func refused(t *testing.T, fx []Effect, want jobstate.Reason, what string) {
	t.Helper()
	r, ok := find[Refusal](fx)
	if !ok || r.Reason != want {
		t.Fatalf("%s: effects %v, want a refusal %s", what, fx, want)
	}
	if _, wrote := find[*Write](fx); wrote {
		t.Fatalf("%s: refused, yet written: %v", what, fx)
	}
}

// On a direct subject only the dispatched worker's key reports for the
// job; a node key, a legacy key and unsigned mode (By nil) are trusted.
func TestWorkerKeyReportsOnlyForTheDispatchedWorker(t *testing.T) {
	d := newDriver(t)
	d.j.cfg.Direct = func(subj, w string) bool { return subj == "worker."+w+".jobs" }
	d.dispatch()
	refused(t, d.feed(succeeded("w2", workerKey("w2", "p"))), jobstate.ReasonNotJobWorker, "another worker's result")
	refused(t, d.feed(&Progress{P: &capv1.JobProgress{JobId: "job-1"}, From: "w2", By: workerKey("w2", "p")}),
		jobstate.ReasonNotJobWorker, "another worker's progress")
	if d.j.State != jobstate.StateDispatched || d.j.Worker != "w1" {
		t.Fatalf("refusals changed the job: %s on %s", d.j.State, d.j.Worker)
	}
	fx := d.feed(succeeded("w1", workerKey("w1", "p")))
	if w, ok := find[*Write](fx); !ok || w.Op.T.Final() != jobstate.StateSucceeded {
		t.Fatalf("the job's own worker's result: %v", fx)
	}
}

// On a pool subject NATS chose the receiver: before any worker spoke for
// the job, a worker key of the job's pool may (and binds the job); a key
// of another pool may not; once bound, only the bound worker reports.
func TestPoolSubjectFirstWorkerOfThePoolBindsTheJob(t *testing.T) {
	d := newDriver(t)
	d.j.cfg.Direct = func(subj, w string) bool { return subj == "worker."+w+".jobs" }
	d.feed(&Submit{Req: &capv1.JobRequest{JobId: "job-1", Topic: "job.x"}})
	d.feed(&PolicyDone{Epoch: d.step, Dec: &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW}})
	fx := d.feed(&PickReply{Epoch: d.step, WorkerID: "w1", Subject: "job.x", Pool: "p"})
	if w, ok := find[*Write](fx); !ok || fieldsOf(t, fx)["pool"] != "p" {
		t.Fatalf("the dispatch does not record its pool: %v %v", w, fx)
	}
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Status: ActivateCreated, State: jobstate.StateDispatched, Fence: 1}})
	refused(t, d.feed(&Progress{P: &capv1.JobProgress{JobId: "job-1"}, From: "w9", By: workerKey("w9", "q")}),
		jobstate.ReasonNotJobWorker, "a worker of another pool")
	fx = d.feed(&Progress{P: &capv1.JobProgress{JobId: "job-1"}, From: "w3", By: workerKey("w3", "p")})
	if _, ok := find[Refusal](fx); ok || d.j.Worker != "w3" {
		t.Fatalf("a worker of the pool speaking first: worker %s, %v", d.j.Worker, fx)
	}
	d.feed(&WriteDone{Epoch: d.step, Res: WriteResult{Step: StepOK}})
	refused(t, d.feed(succeeded("w4", workerKey("w4", "p"))), jobstate.ReasonNotJobWorker, "a second worker of the pool")
	if w, ok := find[*Write](d.feed(succeeded("w3", workerKey("w3", "p")))); !ok || w.Op.T.Final() != jobstate.StateSucceeded {
		t.Fatal("the bound worker's result was not taken")
	}
}

// A client key cancels its tenants' jobs only; an operator's cancel is taken.
func TestClientKeyCancelsOnlyItsTenantsJobs(t *testing.T) {
	d := newDriver(t)
	d.dispatch() // tenant: "default" (no tenant_id)
	cli := &key{role: "client", tenants: []string{"tenantB"}}
	refused(t, d.feed(&Cancel{C: &capv1.JobCancel{JobId: "job-1"}, By: cli}), jobstate.ReasonOutOfScope, "another tenant's client")
	op := &key{role: "operator"}
	if w, ok := find[*Write](d.feed(&Cancel{C: &capv1.JobCancel{JobId: "job-1"}, By: op})); !ok || w.Op.T.Final() != jobstate.StateCancelled {
		t.Fatal("the operator's cancel was not taken")
	}
}
