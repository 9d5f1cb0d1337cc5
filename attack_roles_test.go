package troupe_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/signing"
	"github.com/troupe-run/troupe/worker"
)

// The attacks of issue 28 that roles, scopes and the replay window refuse.
// Each test runs a node that verifies against a key set with roles: the
// node, two workers of pool echo, a client of tenantA, a client of tenantB
// and an operator. Each attack is made with one of those keys (an insider
// holding a listed key), and each refusal is checked in the counter, the
// DLQ where a job is involved, and the job or registry left unchanged.

type roleSetup struct {
	nodeID, w1, w2, cliA, cliB, op string
	node, kw1, kw2, kA, kB, kOp    *signing.Signer
	keys                           *signing.Verifier
}

func newRoleSetup(t *testing.T, tag string) *roleSetup {
	t.Helper()
	s := &roleSetup{nodeID: "rl-node-" + tag, w1: "rl-w1-" + tag, w2: "rl-w2-" + tag, cliA: "rl-cliA-" + tag,
		cliB: "rl-cliB-" + tag, op: "rl-op-" + tag}
	for _, p := range []**signing.Signer{&s.node, &s.kw1, &s.kw2, &s.kA, &s.kB, &s.kOp} {
		priv, _, err := signing.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		if *p, err = signing.ParseSigner(priv); err != nil {
			t.Fatal(err)
		}
	}
	pem := func(k *signing.Signer) string {
		return `"` + strings.ReplaceAll(string(k.PublicPEM()), "\n", `\n`) + `"`
	}
	file := `"` + s.nodeID + `*": {role: node, keys: ` + pem(s.node) + "}\n" +
		`"troupe-saga/*": {role: node, keys: ` + pem(s.node) + "}\n" +
		`"` + s.w1 + `": {role: worker, pools: [echo], keys: ` + pem(s.kw1) + "}\n" +
		`"` + s.w2 + `": {role: worker, pools: [echo], keys: ` + pem(s.kw2) + "}\n" +
		`"` + s.cliA + `": {role: client, tenants: [tenantA], keys: ` + pem(s.kA) + "}\n" +
		`"` + s.cliB + `": {role: client, tenants: [tenantB], keys: ` + pem(s.kB) + "}\n" +
		`"` + s.op + `": {role: operator, keys: ` + pem(s.kOp) + "}\n"
	ks, err := signing.ParseKeySet([]byte(file))
	if err != nil {
		t.Fatalf("%v\n%s", err, file)
	}
	s.keys = signing.NewVerifier(ks)
	return s
}

func (s *roleSetup) fixture(t *testing.T, more ...func(*troupe.Config)) *fixture {
	return newFixture(t, func(c *troupe.Config) {
		c.NodeID, c.Signer, c.Verifier = s.nodeID, s.node, s.keys
		for _, m := range more {
			m(c)
		}
	})
}

// startW1 starts worker w1 (direct subject, signing, verifying with keys
// when given); its handler waits for release (nil: answers at once).
func (s *roleSetup) startW1(f *fixture, keys *signing.Verifier, rec *receipts, release chan struct{}) *worker.Worker {
	f.t.Helper()
	cfg := worker.Config{ID: s.w1, Pool: "echo", Topics: []string{"job.echo"}, Direct: true, SubjectPrefix: f.subj.Prefix(),
		Heartbeat: time.Second, Progress: true, Signer: s.kw1, Verifier: keys,
		Handler: func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
			if release != nil {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return worker.Echo(ctx, req)
		}}
	if rec != nil {
		cfg.OnReceive = rec.hook
	}
	w, err := worker.Start(f.env.NATS, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	f.waitWorkers(1)
	return w
}

func tenantReq(id, tenant string) *capv1.JobRequest {
	r := echoReq(id)
	r.TenantId = tenant
	return r
}

func sealed(t *testing.T, k *signing.Signer, p *capv1.BusPacket) []byte {
	t.Helper()
	b, err := k.Seal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (f *fixture) waitDLQReason(jobID string, reason jobstate.Reason) {
	f.t.Helper()
	f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == jobID && e.Reason == reason })
}

func (f *fixture) requireState(id string, want jobstate.State) {
	f.t.Helper()
	r, err := f.node.Record(context.Background(), id)
	if err != nil || r.State != want {
		f.t.Fatalf("job %s: %v %+v, want %s", id, err, r, want)
	}
}

// Attack 1: a worker's key signs results for a job running on another
// worker — naming that worker, naming itself, naming none. Each is refused
// (out_of_scope at intake, or not_job_worker by the job) and dead-lettered;
// the job keeps running and finishes with its own worker's result.
func TestAttack1ForgedResultFromAnotherWorkersKey(t *testing.T) {
	t.Parallel()
	s := newRoleSetup(t, "a1")
	f := s.fixture(t)
	release := make(chan struct{})
	s.startW1(f, s.keys, nil, release)
	f.signedSubmit(s.kA, s.cliA, tenantReq("job-a1", "tenantA"))
	f.waitState("job-a1", jobstate.StateRunning)

	forge := func(workerID string) []byte {
		res := &capv1.JobResult{JobId: "job-a1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, WorkerId: workerID,
			ResultPtr: "redis://forged"}
		b, err := bus.Encoder{Signer: s.kw2}.Result("trace-job-a1", s.w2, res)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	f.publishRaw(f.subj.Result, forge(s.w1)) // speaks for a worker its key does not list
	f.publishRaw(f.subj.Result, forge(""))   // speaks for no worker
	f.publishRaw(f.subj.Result, forge(s.w2)) // its own id, but the job is not dispatched to it
	waitRejected(t, f.node, "result", signing.Reason(jobstate.ReasonOutOfScope), 2)
	waitRejected(t, f.node, "result", signing.Reason(jobstate.ReasonNotJobWorker), 1)
	f.waitDLQReason("job-a1", jobstate.ReasonOutOfScope)
	f.waitDLQReason("job-a1", jobstate.ReasonNotJobWorker)
	// A progress from the other worker's key: refused by the job, counted.
	pr, err := bus.Encoder{Signer: s.kw2}.Progress("trace-job-a1", s.w2, &capv1.JobProgress{JobId: "job-a1", Percent: 50})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.env.NATS.Publish(f.subj.Progress, pr); err != nil {
		t.Fatal(err)
	}
	waitRejected(t, f.node, "progress", signing.Reason(jobstate.ReasonNotJobWorker), 1)
	f.requireState("job-a1", jobstate.StateRunning)

	close(release)
	r := f.waitState("job-a1", jobstate.StateSucceeded)
	if r.ResultPtr == "redis://forged" {
		t.Fatalf("the forged result_ptr was recorded: %+v", r)
	}
}

// Attack 2: a worker's key announces a worker it is not (to attract
// dispatches), itself in a pool outside its scope, and rewrites another
// worker's entry. All three are refused and counted; the registry keeps
// only the worker's own entry.
func TestAttack2HeartbeatImpersonation(t *testing.T) {
	t.Parallel()
	s := newRoleSetup(t, "a2")
	f := s.fixture(t)
	s.startW1(f, nil, nil, nil)
	beat := func(hb *capv1.Heartbeat) {
		b, err := bus.Encoder{Signer: s.kw1}.Heartbeat(s.w1, hb)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.env.NATS.Publish(f.subj.Heartbeat, b); err != nil {
			t.Fatal(err)
		}
	}
	direct := map[string]string{"troupe.dispatch": "direct"}
	beat(&capv1.Heartbeat{WorkerId: "evil", Pool: "echo", MaxParallelJobs: 4, Labels: direct})
	beat(&capv1.Heartbeat{WorkerId: s.w1, Pool: "secure", MaxParallelJobs: 4, Labels: direct})
	beat(&capv1.Heartbeat{WorkerId: s.w2, Pool: "nowhere", ActiveJobs: 500, MaxParallelJobs: 4})
	waitRejected(t, f.node, "heartbeat", signing.Reason(jobstate.ReasonOutOfScope), 3)
	ws, err := f.node.Workers()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.ID != s.w1 || w.Pool != "echo" {
			t.Fatalf("registry holds %+v after refused heartbeats", w)
		}
	}
}

// Attack 3: a worker that verifies runs only dispatches signed by a node
// key: a JobRequest signed by another worker's key or a client's key, sent
// straight to its subject, is dropped and counted.
func TestAttack3WorkerRunsOnlyNodeDispatches(t *testing.T) {
	t.Parallel()
	s := newRoleSetup(t, "a3")
	f := s.fixture(t)
	rec := newReceipts()
	w := s.startW1(f, s.keys, rec, nil)
	for i, k := range []struct {
		signer *signing.Signer
		sender string
	}{{s.kw2, s.w2}, {s.kA, s.cliA}} {
		req := tenantReq("job-a3-bypass-"+string(rune('a'+i)), "tenantA")
		b, err := bus.Encoder{Signer: k.signer}.Request("t", k.sender, req)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.env.NATS.Publish(f.subj.Worker(s.w1), b); err != nil {
			t.Fatal(err)
		}
	}
	_ = f.env.NATS.Flush()
	deadline := time.Now().Add(10 * time.Second)
	for w.Rejected() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if w.Rejected() != 2 || rec.count("job-a3-bypass-a") != 0 || rec.count("job-a3-bypass-b") != 0 {
		t.Fatalf("rejected %d, ran %d and %d", w.Rejected(), rec.count("job-a3-bypass-a"), rec.count("job-a3-bypass-b"))
	}
	// The node's own dispatch still runs.
	f.signedSubmit(s.kA, s.cliA, tenantReq("job-a3", "tenantA"))
	f.waitState("job-a3", jobstate.StateSucceeded)
}

// Attack 4: unsigned capacity gossip claiming the worker is full, and
// unauthenticated questions on the node's waiting/waitlist/queue subjects.
// The gossip is dropped (jobs keep being placed) and the questions go
// unanswered; a node-signed question is answered.
func TestAttack4UnsignedGossipAndWaitlist(t *testing.T) {
	t.Parallel()
	s := newRoleSetup(t, "a4")
	f := s.fixture(t)
	s.startW1(f, nil, nil, nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // about 5 a second, for at most 30 s
		defer wg.Done()
		flood := router.EncodePeerLoad(&router.PeerLoad{Node: "evil-peer", Full: true,
			Counts: map[string]int32{s.w1: 100000}})
		for i := 0; i < 150; i++ {
			_ = f.env.NATS.Publish(f.subj.Capacity(), flood)
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	waitRejected(t, f.node, "capacity", signing.ReasonUnsigned, 2)
	f.signedSubmit(s.kA, s.cliA, tenantReq("job-a4", "tenantA"))
	f.waitState("job-a4", jobstate.StateSucceeded)

	body, _ := json.Marshal(map[string]any{"tenant": "", "limit": 100})
	for _, subj := range []string{f.subj.QueueList(s.nodeID), f.subj.QueueFind(s.nodeID), f.subj.QueueAsk(s.nodeID)} {
		if _, err := f.env.NATS.Request(subj, body, 300*time.Millisecond); err == nil {
			t.Fatalf("%s answered an unsigned question", subj)
		}
	}
	waitRejected(t, f.node, "queue", signing.ReasonUnsigned, 3)
	// Signed by a worker key: not a node.
	m := nats.NewMsg(f.subj.QueueList(s.nodeID))
	m.Data = body
	at, sig, err := s.kw1.SignMessage(m.Subject, time.Now(), body)
	if err != nil {
		t.Fatal(err)
	}
	m.Header.Set("Troupe-Sender", s.w1)
	m.Header.Set("Troupe-Signed-At", at)
	m.Header.Set("Troupe-Signature", sig)
	if _, err := f.env.NATS.RequestMsg(m, 300*time.Millisecond); err == nil {
		t.Fatal("the waitlist answered a worker key")
	}
	waitRejected(t, f.node, "queue", signing.Reason(jobstate.ReasonForbiddenRole), 1)
	// Signed by a node key: answered.
	at, sig, _ = s.node.SignMessage(m.Subject, time.Now(), body)
	m.Header.Set("Troupe-Sender", s.nodeID)
	m.Header.Set("Troupe-Signed-At", at)
	m.Header.Set("Troupe-Signature", sig)
	if reply, err := f.env.NATS.RequestMsg(m, 5*time.Second); err != nil || string(reply.Data) != "[]" {
		t.Fatalf("a node's question: %v %v", reply, err)
	}
}

// Attack 8 (keys part): a worker's key submits and cancels; a client's key
// submits for a tenant outside its scope and cancels another tenant's job.
// Each is refused and dead-lettered; an operator's cancel is taken.
func TestAttack8WorkerKeyCancelsAndSubmits(t *testing.T) {
	t.Parallel()
	s := newRoleSetup(t, "a8")
	f := s.fixture(t)
	release := make(chan struct{})
	defer close(release)
	s.startW1(f, nil, nil, release)

	f.signedSubmit(s.kw1, s.w1, tenantReq("job-a8-byworker", "tenantA"))
	f.waitDLQReason("job-a8-byworker", jobstate.ReasonForbiddenRole)
	f.signedSubmit(s.kA, s.cliA, tenantReq("job-a8-othertenant", "tenantB"))
	f.waitDLQReason("job-a8-othertenant", jobstate.ReasonOutOfScope)
	waitRejected(t, f.node, "submit", signing.Reason(jobstate.ReasonForbiddenRole), 1)
	waitRejected(t, f.node, "submit", signing.Reason(jobstate.ReasonOutOfScope), 1)
	for _, id := range []string{"job-a8-byworker", "job-a8-othertenant"} {
		if r, err := f.node.Record(context.Background(), id); err == nil {
			t.Fatalf("refused submit created %s: %+v", id, r)
		}
	}

	f.signedSubmit(s.kB, s.cliB, tenantReq("job-a8", "tenantB"))
	f.waitState("job-a8", jobstate.StateRunning)
	cancel := func(k *signing.Signer, sender string) {
		b, err := bus.Encoder{Signer: k}.Cancel("t", sender, &capv1.JobCancel{JobId: "job-a8", Reason: "attack"})
		if err != nil {
			t.Fatal(err)
		}
		f.publishRaw(f.subj.Cancel, b)
	}
	cancel(s.kw1, s.w1)
	f.waitDLQReason("job-a8", jobstate.ReasonForbiddenRole)
	cancel(s.kA, s.cliA) // tenantA's client, tenantB's job
	f.waitDLQReason("job-a8", jobstate.ReasonOutOfScope)
	waitRejected(t, f.node, "cancel", signing.Reason(jobstate.ReasonForbiddenRole), 1)
	waitRejected(t, f.node, "cancel", signing.Reason(jobstate.ReasonOutOfScope), 1)
	f.requireState("job-a8", jobstate.StateRunning)
	cancel(s.kOp, s.op)
	f.waitState("job-a8", jobstate.StateCancelled)
}

// Attack 5 (replay): a captured signed submit, result or cancel published
// again is refused as replayed; a signed submit created outside the window
// (as one replayed after its job's record expired would be) is refused as
// stale. Both are dead-lettered and counted.
func TestAttack5ReplayedPacketsAreRefused(t *testing.T) {
	t.Parallel()
	s := newRoleSetup(t, "a5")
	f := s.fixture(t, func(c *troupe.Config) { c.Tuning.ReplayWindow = time.Minute })
	release := make(chan struct{})
	s.startW1(f, nil, nil, release)

	submit := sealed(t, s.kA, &capv1.BusPacket{SenderId: s.cliA, CreatedAt: timestamppb.Now(), ProtocolVersion: 1,
		Payload: &capv1.BusPacket_JobRequest{JobRequest: tenantReq("job-a5", "tenantA")}})
	f.publishRaw(f.subj.Submit, submit)
	f.waitState("job-a5", jobstate.StateRunning)
	f.publishRaw(f.subj.Submit, submit)
	f.waitDLQReason("job-a5", jobstate.ReasonReplayed)
	waitRejected(t, f.node, "submit", signing.ReasonReplayed, 1)

	cancel := sealed(t, s.kOp, &capv1.BusPacket{SenderId: s.op, CreatedAt: timestamppb.Now(), ProtocolVersion: 1,
		Payload: &capv1.BusPacket_JobCancel{JobCancel: &capv1.JobCancel{JobId: "job-a5", Reason: "op"}}})
	f.publishRaw(f.subj.Cancel, cancel)
	f.waitState("job-a5", jobstate.StateCancelled)
	f.publishRaw(f.subj.Cancel, cancel)
	waitRejected(t, f.node, "cancel", signing.ReasonReplayed, 1)
	close(release)

	// A result: taken once, refused the second time.
	f.signedSubmit(s.kA, s.cliA, tenantReq("job-a5r", "tenantA"))
	f.waitState("job-a5r", jobstate.StateSucceeded)
	result := sealed(t, s.kw1, &capv1.BusPacket{SenderId: s.w1, CreatedAt: timestamppb.Now(), ProtocolVersion: 1,
		Payload: &capv1.BusPacket_JobResult{JobResult: &capv1.JobResult{JobId: "job-a5r", WorkerId: s.w1,
			Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED}}})
	f.publishRaw(f.subj.Result, result)
	f.publishRaw(f.subj.Result, result)
	waitRejected(t, f.node, "result", signing.ReasonReplayed, 1)

	old := sealed(t, s.kA, &capv1.BusPacket{SenderId: s.cliA, CreatedAt: timestamppb.New(time.Now().Add(-10 * time.Minute)),
		ProtocolVersion: 1, Payload: &capv1.BusPacket_JobRequest{JobRequest: tenantReq("job-a5-old", "tenantA")}})
	f.publishRaw(f.subj.Submit, old)
	f.waitDLQReason("job-a5-old", jobstate.ReasonStalePacket)
	waitRejected(t, f.node, "submit", signing.ReasonStale, 1)
	if _, err := f.node.Record(context.Background(), "job-a5-old"); err == nil {
		t.Fatal("a stale submit created its job")
	}
}

// Two replicas that verify, with roles: every forward between them, their
// capacity gossip and their queue questions are signed by node keys and
// taken; nothing is refused, and every job completes.
func TestSignedReplicasForwardAndGossipWithRoles(t *testing.T) {
	t.Parallel()
	s := newRoleSetup(t, "rep")
	f := s.fixture(t)
	a := f.node
	b := newNodeOn(t, f, s.nodeID+"-b", func(c *troupe.Config) { c.Signer, c.Verifier = s.node, s.keys })
	s.startW1(f, nil, nil, nil)
	waitLive(t, a, 1)
	waitLive(t, b, 1)
	const jobs = 40
	for i := range jobs {
		f.signedSubmit(s.kA, s.cliA, tenantReq(fmt.Sprintf("rep-%d", i), "tenantA"))
	}
	for i := range jobs {
		f.waitState(fmt.Sprintf("rep-%d", i), jobstate.StateSucceeded)
	}
	if _, err := b.WaitingJobs(context.Background(), "", 10); err != nil {
		t.Fatal(err)
	}
	taken := counter(t, a, "troupe_events_forwarded_total", "taken") + counter(t, b, "troupe_events_forwarded_total", "taken")
	for _, n := range []*troupe.Node{a, b} {
		mfs, err := n.Metrics().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "troupe_packets_rejected_total" {
				for _, m := range mf.Metric {
					if m.GetCounter().GetValue() > 0 {
						t.Fatalf("%s refused packets between its signed peers: %v", n.ID(), m)
					}
				}
			}
		}
	}
	t.Logf("%d jobs, %v results forwarded to their owner", jobs, taken)
}
